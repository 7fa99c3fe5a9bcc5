#include "common/kernels/rope/rope.h"

#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/custom_function.h>

#include "common/kernels/env_switch.h"
#include "common/kernels/launch_check.h"
#include "common/kernels/rope/params.h"

namespace dflash::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool Enabled() {
  static const bool enabled = EnvSwitchOn("DFLASH_FUSED_ROPE");
  return enabled;
}

RopeDType DTypeOf(c10::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return RopeDType::kBFloat16;
    case at::kHalf:
      return RopeDType::kFloat16;
    default:
      return RopeDType::kFloat32;
  }
}

bool Shapes(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto dt = x.scalar_type();
  return x.dim() == 3 && x.size(2) % 2 == 0 && cos.dim() == 2 && cos.size(0) == x.size(0) &&
         cos.size(1) == x.size(2) && sin.sizes() == cos.sizes() && cos.scalar_type() == dt &&
         sin.scalar_type() == dt && cos.device() == x.device() && sin.device() == x.device() &&
         (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf);
}

at::Tensor Run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  at::Tensor out = at::empty_like(xc);
  RopeParams p;
  p.x = xc.data_ptr();
  p.cos = cc.data_ptr();
  p.sin = sc.data_ptr();
  p.out = out.data_ptr();
  p.rows = xc.size(0);
  p.heads = xc.size(1);
  p.dim = xc.size(2);
  p.dtype = DTypeOf(xc.scalar_type());
  p.backward = backward;
  CheckLaunch(LaunchRope(p, at::cuda::getCurrentCUDAStream(x.device().index()).stream()),
              "fused RoPE: launch failed");
  return out;
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return Run(x, cos, sin, /*backward=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    return {Run(grad_outputs[0], saved[0], saved[1], /*backward=*/true), at::Tensor(),
            at::Tensor()};
  }
};

bool NormRopeShapes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                    const at::Tensor& sin) {
  if (!x.defined() || !weight.defined() || !cos.defined() || !sin.defined()) return false;
  if (x.dim() != 3 || !x.is_cuda()) return false;
  const int64_t d = x.size(2);
  const auto dt = x.scalar_type();
  return (d == 64 || d == 128 || d == 256) && x.stride(2) == 1 && x.stride(1) == d &&
         x.stride(0) >= x.size(1) * d && weight.dim() == 1 && weight.size(0) == d &&
         weight.scalar_type() == dt && weight.device() == x.device() && Shapes(x, cos, sin) &&
         (!at::GradMode::is_enabled() || !x.requires_grad());
}

}  // namespace

bool FusedNormRopeEnabled() {
  static const bool enabled = EnvSwitchOn("DFLASH_FUSED_QK_NORM_ROPE");
  return enabled;
}

bool SupportsFusedNormRope(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                           const at::Tensor& sin) {
  return FusedNormRopeEnabled() && NormRopeShapes(x, weight, cos, sin);
}

at::Tensor FusedNormRope(const at::Tensor& x, const at::Tensor& weight, double eps,
                         const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(NormRopeShapes(x, weight, cos, sin),
              "fused q/k norm and RoPE: x must be [T, H, D] on CUDA (D 64, 128 or 256, heads ",
              "contiguous), weight [D] and cos, sin [T, D] of its dtype and device, outside ",
              "autograd; got ", x.sizes(), " strides ", x.strides(), ", ", weight.sizes(), ", ",
              cos.sizes(), ", ", sin.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor wc = weight.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  at::Tensor out = at::empty({x.size(0), x.size(1), x.size(2)}, x.options());
  NormRopeParams p;
  p.x = x.data_ptr();
  p.weight = wc.data_ptr();
  p.cos = cc.data_ptr();
  p.sin = sc.data_ptr();
  p.out = out.data_ptr();
  p.rows = x.size(0);
  p.heads = x.size(1);
  p.dim = x.size(2);
  p.row_stride = x.stride(0);
  p.eps = static_cast<float>(eps);
  p.dtype = DTypeOf(x.scalar_type());
  CheckLaunch(LaunchNormRope(p, at::cuda::getCurrentCUDAStream(x.device().index()).stream()),
              "fused q/k norm and RoPE: launch failed");
  return out;
}

bool SupportsFusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return Enabled() && x.defined() && x.is_cuda() && cos.defined() && sin.defined() &&
         Shapes(x, cos, sin);
}

at::Tensor FusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.is_cuda() && Shapes(x, cos, sin), "fused RoPE: x must be [T, H, D] on CUDA (D ",
              "even) and cos, sin [T, D] of its dtype and device; got ", x.sizes(), ", ",
              cos.sizes(), ", ", sin.sizes());
  return RopeFunction::apply(x, cos.detach(), sin.detach());
}

}  // namespace dflash::kernels

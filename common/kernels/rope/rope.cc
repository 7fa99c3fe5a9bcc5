#include "common/kernels/rope/rope.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <cstring>

#include "common/kernels/launch_check.h"
#include "common/kernels/rope/params.h"

namespace dflash::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool Enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DFLASH_FUSED_ROPE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
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

}  // namespace

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

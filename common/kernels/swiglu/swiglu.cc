#include "common/kernels/swiglu/swiglu.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "common/kernels/env_switch.h"
#include "common/kernels/launch_check.h"
#include "common/kernels/swiglu/params.h"

namespace dflash::kernels {
namespace {

bool Enabled() {
  static const bool enabled = EnvSwitchOn("DFLASH_FUSED_SWIGLU");
  return enabled;
}

SwiGluDType DTypeOf(c10::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return SwiGluDType::kBFloat16;
    case at::kHalf:
      return SwiGluDType::kFloat16;
    default:
      return SwiGluDType::kFloat32;
  }
}

bool Matching(const at::Tensor& a, const at::Tensor& b) {
  const auto dt = a.scalar_type();
  return a.defined() && b.defined() && a.is_cuda() && b.device() == a.device() &&
         b.sizes() == a.sizes() && b.scalar_type() == dt &&
         (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf);
}

void Check(const at::Tensor& g, const at::Tensor& u) {
  TORCH_CHECK(Matching(g, u), "fused SwiGLU: g and u must be CUDA tensors of one shape and dtype ",
              "(fp32, bf16 or fp16); got ", g.sizes(), " ", g.scalar_type(), " and ", u.sizes(),
              " ", u.scalar_type());
}

// A row-major [N, 2I] CUDA tensor the kernels take (its two column halves: g and u).
bool RowMajorHalves(const at::Tensor& t) {
  return t.defined() && t.dim() == 2 && t.size(1) > 0 && t.size(1) % 2 == 0 && t.stride(1) == 1 &&
         t.stride(0) == t.size(1) && Matching(t, t);
}

void Launch(const SwiGluParams& p, const at::Tensor& on) {
  CheckLaunch(LaunchSwiGlu(p, at::cuda::getCurrentCUDAStream(on.device().index()).stream()),
              "fused SwiGLU: launch failed");
}

}  // namespace

bool FusedSwiGluEnabled() { return Enabled(); }

bool SupportsFusedSwiGlu(const at::Tensor& g, const at::Tensor& u) {
  return Enabled() && Matching(g, u);
}

at::Tensor FusedSwiGlu(const at::Tensor& g, const at::Tensor& u) {
  Check(g, u);
  const c10::cuda::CUDAGuard guard(g.device());
  const at::Tensor gc = g.contiguous(), uc = u.contiguous();
  at::Tensor out = at::empty_like(gc, at::MemoryFormat::Contiguous);
  SwiGluParams p;
  p.g = gc.data_ptr();
  p.u = uc.data_ptr();
  p.out = out.data_ptr();
  p.n = gc.numel();
  p.dtype = DTypeOf(gc.scalar_type());
  Launch(p, gc);
  return out;
}

bool SupportsFusedSwiGluHalves(const at::Tensor& gate_up) {
  return Enabled() && RowMajorHalves(gate_up);
}

at::Tensor FusedSwiGluHalves(const at::Tensor& gate_up) {
  TORCH_CHECK(RowMajorHalves(gate_up),
              "fused SwiGLU over halves: gate_up must be a row-major [N, 2I] CUDA tensor (fp32, "
              "bf16 or fp16); got ",
              gate_up.sizes(), " strides ", gate_up.strides(), " ", gate_up.scalar_type());
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, gate_up.options());
  SwiGluParams p;
  p.g = gate_up.data_ptr();
  p.u = static_cast<const char*>(gate_up.data_ptr()) + inter * gate_up.element_size();
  p.out = out.data_ptr();
  p.n = rows * inter;
  p.cols = inter;
  p.ld = 2 * inter;
  p.dtype = DTypeOf(gate_up.scalar_type());
  Launch(p, gate_up);
  return out;
}

std::pair<at::Tensor, at::Tensor> FusedSwiGluBackward(at::Tensor da, const at::Tensor& g,
                                                      const at::Tensor& u) {
  Check(g, u);
  Check(da, g);
  const c10::cuda::CUDAGuard guard(g.device());
  const at::Tensor gc = g.contiguous(), uc = u.contiguous();
  if (!da.is_contiguous()) da = da.contiguous();
  at::Tensor du = at::empty_like(gc, at::MemoryFormat::Contiguous);
  SwiGluParams p;
  p.g = gc.data_ptr();
  p.u = uc.data_ptr();
  p.da = da.data_ptr();
  p.out = da.data_ptr();  // dg over da
  p.du = du.data_ptr();
  p.n = gc.numel();
  p.dtype = DTypeOf(gc.scalar_type());
  p.backward = true;
  Launch(p, gc);
  return {da, du};
}

}  // namespace dflash::kernels

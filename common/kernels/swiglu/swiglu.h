// SwiGLU's elementwise part on CUDA in one kernel per direction (swiglu_launch.cu), for the
// drafter's MLP (common/drafter/lean_ops.cc, SwiGluMlp) and the target's (forward only): LibTorch's
// composition there (silu, mul forward; silu, two muls and silu_backward in the backward, each a
// pass over [N, I]) is the reference it replaces on the GPU (tests/kernels/swiglu_gpu_test.cc
// compares the two and an fp32 reference). Not differentiable itself: SwiGluMlp's autograd function
// calls both directions. DFLASH_FUSED_SWIGLU=0 in the environment keeps the composition (benchmarks
// measure both in one build; a worker records the variable in its kernel overrides).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace dflash::kernels {

// Whether DFLASH_FUSED_SWIGLU leaves the fused kernels on (it is not "0").
bool FusedSwiGluEnabled();

// Whether the fused kernels take these: g and u of one shape, dtype (fp32, bf16, fp16) and CUDA
// device; and DFLASH_FUSED_SWIGLU is not "0".
bool SupportsFusedSwiGlu(const at::Tensor& g, const at::Tensor& u);

// silu(g) * u.
at::Tensor FusedSwiGlu(const at::Tensor& g, const at::Tensor& u);

// The same over the two column halves of one [N, 2I] product (the target's fused gate_up
// projection, common/nn/target_model.cc): silu(gate_up[:, :I]) * gate_up[:, I:], [N, I], read in
// place (LibTorch's composition reads each strided half, writes silu's output, reads it again).
// Taken when gate_up is a row-major [N, 2I] CUDA tensor (fp32, bf16, fp16) and
// DFLASH_FUSED_SWIGLU is not "0".
bool SupportsFusedSwiGluHalves(const at::Tensor& gate_up);
at::Tensor FusedSwiGluHalves(const at::Tensor& gate_up);

// Given da, the gradient of silu(g) * u: returns {dg, du}. dg is written over `da` (which must
// then be contiguous and not needed afterwards), so the backward allocates one [N, I] tensor.
std::pair<at::Tensor, at::Tensor> FusedSwiGluBackward(at::Tensor da, const at::Tensor& g,
                                                      const at::Tensor& u);

}  // namespace dflash::kernels

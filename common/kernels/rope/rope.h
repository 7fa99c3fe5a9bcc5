// Rotary position embedding on CUDA in one kernel per direction (rope_launch.cu), as a
// differentiable LibTorch op: nn::ApplyRope's ATen composition (narrow, neg, cat, two broadcast
// multiplies and an add forward, more backward) is the reference it replaces on the GPU
// (tests/kernels/rope_gpu_test.cc compares the two). DFLASH_FUSED_ROPE=0 in the environment keeps
// the ATen path (benchmarks measure both in one build).
#pragma once

#include <ATen/core/Tensor.h>

namespace dflash::kernels {

// Whether FusedRope takes these: x [T, H, D] on a CUDA device, D even, cos and sin [T, D] of x's
// dtype and device (no partial rotary), fp32, bf16 or fp16; and DFLASH_FUSED_ROPE is not "0".
bool SupportsFusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// x cos + rotate_half(x) sin, differentiable in x (the tables are constants). TORCH_CHECKs what
// SupportsFusedRope checks.
at::Tensor FusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace dflash::kernels

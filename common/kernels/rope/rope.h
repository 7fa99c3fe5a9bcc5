// Rotary position embedding on CUDA in one kernel per direction (rope_launch.cu), as a
// differentiable LibTorch op: nn::ApplyRope's ATen composition (narrow, neg, cat, two broadcast
// multiplies and an add forward, more backward) is the reference it replaces on the GPU
// (tests/kernels/rope_gpu_test.cc compares the two). DFLASH_FUSED_ROPE=0 in the environment keeps
// the ATen path (benchmarks measure both in one build). Also a target's q / k RMSNorm and RoPE in
// one inference pass (FusedNormRope; DFLASH_FUSED_QK_NORM_ROPE=0 keeps the two ops).
#pragma once

#include <ATen/core/Tensor.h>

namespace dflash::kernels {

// Whether FusedRope takes these: x [T, H, D] on a CUDA device, D even, cos and sin [T, D] of x's
// dtype and device (no partial rotary), fp32, bf16 or fp16; and DFLASH_FUSED_ROPE is not "0".
bool SupportsFusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// x cos + rotate_half(x) sin, differentiable in x (the tables are constants). TORCH_CHECKs what
// SupportsFusedRope checks.
at::Tensor FusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// A target's per-head q / k RMSNorm then RoPE in one kernel (norm_rope_launch.cu), for inference:
// the forward only, reading x in place from the fused qkv product. Takes x [T, H, D] on CUDA with
// stride(2) 1 and stride(1) D (any row stride), D 64, 128 or 256, weight [D] and cos, sin [T, D]
// (no partial rotary) all of x's dtype (fp32, bf16, fp16) and device, outside grad mode (or x
// without requires_grad); and DFLASH_FUSED_QK_NORM_ROPE is not "0".
bool SupportsFusedNormRope(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                           const at::Tensor& sin);

// ApplyRope(RmsNorm(x, weight, eps)) as one pass: [T, H, D] contiguous. TORCH_CHECKs what
// SupportsFusedNormRope checks (the switch aside).
at::Tensor FusedNormRope(const at::Tensor& x, const at::Tensor& weight, double eps,
                         const at::Tensor& cos, const at::Tensor& sin);

// Whether DFLASH_FUSED_QK_NORM_ROPE leaves the fused q / k norm and RoPE on ("0": off).
bool FusedNormRopeEnabled();

}  // namespace dflash::kernels

// Building blocks shared by the target transformer and the DFlash drafter (method.md §2): RMSNorm,
// rotary position embedding (NeoX rotate-half, optional llama3 frequency scaling), linear layers.
// Every function computes in the dtype of its input the way Hugging Face does, so that fp32 runs
// match the HF reference to rounding; callers hold c10::InferenceMode.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "common/model/hf_config.h"

namespace dflash::nn {

// HF RMSNorm: normalizes in fp32, casts back to x's dtype, then scales by `weight`.
// x [..., N], weight [N] -> [..., N].
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Qwen3-Next / Qwen3.5 RMSNorm: normalizes and scales in fp32, then casts to x's dtype once.
// `scale` [N] fp32 is (1 + weight) of the zero-centered checkpoint weight.
at::Tensor RmsNormFp32Scale(const at::Tensor& x, const at::Tensor& scale, double eps);

// y = x W^T (+ b). x [..., In], weight [Out, In], bias [Out] or undefined -> [..., Out].
at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// Inverse frequencies [dim / 2] fp32 on the CPU: theta^(-2i/dim), then, when the config has
// rope_scaling of type llama3, HF's _compute_llama3_parameters (low frequencies divided by
// `factor`, a smooth blend between the two wavelength thresholds). dim 0 means head_dim; partial
// RoPE (Qwen3.5) passes model::RotaryDim.
at::Tensor RopeInvFreq(const model::TransformerConfig& config, int64_t dim = 0);

// cos and sin tables for the given positions: positions [T] int64, inv_freq [D/2] fp32 (same
// device)
// -> cos, sin [T, D] in `dtype`; angles are computed in fp32 as HF does.
struct RopeTables {
  at::Tensor cos;
  at::Tensor sin;
};
RopeTables MakeRopeTables(const at::Tensor& positions, const at::Tensor& inv_freq,
                          c10::ScalarType dtype);

// x [T, H, D] rotated by the tables of its rows: x*cos + rotate_half(x)*sin, rotate_half(x) =
// [-x2, x1] for the halves x1, x2 of the last dimension. Returns a new [T, H, D] tensor. Tables
// narrower than D (partial RoPE) rotate the first columns and pass the rest through.
at::Tensor ApplyRope(const at::Tensor& x, const RopeTables& tables);

// ApplyRope(RmsNorm(x, weight, eps), tables): a target's per-head q / k norm and RoPE. On CUDA,
// outside autograd, one pass of common/kernels/rope (FusedNormRope: reads x where it lies in the
// qkv product; not with DFLASH_FUSED_QK_NORM_ROPE=0), else the two ops, its reference.
at::Tensor NormRope(const at::Tensor& x, const at::Tensor& weight, double eps,
                    const RopeTables& tables);
// Which NormRope runs on `device` in `dtype` for head_dim `d`: "fused" or "rms_norm, then rope"
// (a model's kernel report).
const char* NormRopeKernel(const c10::Device& device, c10::ScalarType dtype, int64_t d);

// SwiGLU over the two column halves of one fused [T, 2I] gate_up product: silu(gate_up[:, :I]) *
// gate_up[:, I:], [T, I]. On CUDA one pass of common/kernels/swiglu (FusedSwiGluHalves; not with
// DFLASH_FUSED_SWIGLU=0), else LibTorch's composition, its reference.
at::Tensor SwiGluHalves(const at::Tensor& gate_up);
// Which of the two SwiGluHalves runs on `device` in `dtype`: "fused swiglu" or "silu and mul
// (ATen)" (a model's kernel report).
const char* SwiGluHalvesKernel(const c10::Device& device, c10::ScalarType dtype);

}  // namespace dflash::nn

// Fused block-sparse DFlash attention on CUDA: the LibTorch side of
// fwd_kernel*.cuh / bwd_kernel*.cuh (wgmma on compute capability 9.0, mma.sync elsewhere). bf16
// only, head_dim 64 or 128, or 256 on compute capability 9.0 (the backward of 256 exists only as
// wgmma); 1 to 64 query heads per kv head. SupportsFusedDflashAttention says whether
// a call qualifies.
// The CPU reference is drafter::ReferenceDrafterAttention (the GPU tests' oracle).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::kernels {

// The work lists of schedule.h for one mask, on the compute device (built once per batch and
// shared by every layer, forward and backward).
struct DflashAttnPlan {
  at::Tensor fwd_items;  // [n_fwd, 6] int32 (AttnFwdItem)
  at::Tensor bwd_items;  // [n_bwd, 6] int32 (AttnBwdItem)
  at::Tensor anchors;    // [n] int32
  int64_t context_rows = 0, block_size = 0, group = 0;
  // A sliding-window layer's plan (params.h): window 0 (none) or >= block_size; block_causal:
  // slot k sees its block's slots k' <= k only.
  int64_t window = 0;
  bool block_causal = false;
};

// anchors, ctx_begin: [n] int64 on any device (copied to the host once). TORCH_CHECKs the mask.
DflashAttnPlan MakeDflashAttnPlan(const at::Tensor& anchors, const at::Tensor& ctx_begin,
                                  int64_t context_rows, int64_t block_size, int64_t group,
                                  c10::Device device, int64_t window = 0,
                                  bool block_causal = false);

// True when q [Q, Hq, D] and k [rows, Hkv, D] can run fused (backward included).
bool SupportsFusedDflashAttention(const at::Tensor& q, const at::Tensor& k);
// The same from the shapes: a device, the compute dtype, the head dim and the query heads per kv
// head.
bool FusedDflashAttentionQualifies(c10::Device device, c10::ScalarType dtype, int64_t head_dim,
                                   int64_t group);

// q [Q, Hq, D]; k, v [T + Q, Hkv, D] bf16 on the plan's device; returns [Q, Hq, D], differentiable
// in q, k and v (backward: bwd_kernel.cuh). Same contract as drafter::DrafterAttention::Forward.
at::Tensor FusedDflashAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const DflashAttnPlan& plan, double scale);

// Packed causal attention of the target (inference only): q [T, Hq, D], k, v [T, Hkv, D] bf16 on
// CUDA; cu_seqlens [docs + 1] int64 on the host. Returns [T, Hq, D].
at::Tensor FusedCausalVarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& cu_seqlens, double scale);

}  // namespace dflash::kernels

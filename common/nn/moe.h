// The sparse mixture-of-experts MLP of Qwen3-MoE targets: a router picks top-k experts
// per token; each expert is a SwiGLU MLP. Computed grouped by expert: the (token, expert) pairs
// are sorted by expert, the experts' GEMMs run over their contiguous rows, and the weighted
// outputs are summed back per token. No per-token loops. On CUDA in bf16 (H and I multiples of 8)
// the experts' GEMMs are two grouped GEMMs (ATen's _grouped_mm, one launch for all experts, no
// host synchronisation); elsewhere one GEMM pair per expert that received rows (one host
// synchronisation per layer for the per-expert row counts), which is also the reference the GPU
// test compares the grouped path with.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::nn {

struct MoeWeights {
  at::Tensor router;   // [E, H]: mlp.gate.weight
  at::Tensor gate_up;  // [E, 2*I, H]: each expert's gate_proj rows, then its up_proj rows
  at::Tensor down;     // [E, H, I]
  // A shared expert (Qwen3-Next, Qwen3.5-MoE), else undefined: every token also passes through
  // it, scaled by sigmoid(x shared_gate^T).
  at::Tensor shared_gate_up;  // [2*Is, H]: gate_proj rows, then up_proj rows
  at::Tensor shared_down;     // [H, Is]
  at::Tensor shared_gate;     // [1, H]: shared_expert_gate.weight
  int64_t top_k = 0;
  bool norm_topk_prob = false;
  bool defined() const { return router.defined(); }
};

// x [T, H] -> [T, H], as transformers' Qwen3MoeSparseMoeBlock: router logits in the model's dtype,
// softmax over experts in fp32, top-k (renormalized to sum 1 when norm_topk_prob), weights cast
// to the model's dtype, sum over the chosen experts of weight * down(silu(gate) * up); plus the
// gated shared expert when there is one.
// `grouped_gemm` false forces the per-expert loop.
at::Tensor MoeMlp(const at::Tensor& x, const MoeWeights& w, bool grouped_gemm = true);

}  // namespace dflash::nn

// The gated delta-rule (linear attention) layers of hybrid targets: Qwen3-Next and Qwen3.5/3.6.
// A layer projects its input to q, k, v (through a short causal depthwise
// convolution and silu), an output gate z, a write strength beta and a decay g, runs the gated
// delta rule per value head
//
//   S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,   o_t = S_t^T q_t
//
// (q, k L2-normalized, q scaled by head_k_dim^-0.5, S [dk, dv] in fp32), normalizes o per head
// gated by silu(z), and projects back. Packed documents are independent: the convolution and the
// recurrent state restart at every document boundary.
//
// The scan has two implementations: GatedDeltaRuleReference, token by token (the CPU reference,
// transformers' torch_recurrent_gated_delta_rule), and GatedDeltaRuleChunked, the chunked form
// (transformers' torch_chunk_gated_delta_rule; the DeltaNet "UT transform"): 64-token chunks never
// cross a document, and each document is padded only to a multiple of 64 rows (no padding to the
// longest document); within a chunk everything is a batched GEMM or triangular solve over all
// chunks and heads, and only the chunks of a document are sequential: step j of the scan runs
// chunk j of every document that has one, in one batch. The model runs the chunked form on every
// device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/model/hf_config.h"
#include "common/nn/attention.h"

namespace dflash::nn {

struct GatedDeltaWeights {
  // [2*Kd + Vd + Vd + 2*Hv, H]: in_proj_qkv (q heads, k heads, v heads), in_proj_z, in_proj_b,
  // in_proj_a rows, fused into one GEMM at load (Kd = Hk * dk, Vd = Hv * dv).
  at::Tensor in_proj;
  at::Tensor conv;      // [2*Kd + Vd, kernel]: conv1d.weight without its unit middle dimension
  at::Tensor dt_bias;   // [Hv]
  at::Tensor a_log;     // [Hv]
  at::Tensor norm;      // [dv]: the gated RMSNorm's weight (plain, not zero-centered)
  at::Tensor out_proj;  // [H, Vd]
  bool defined() const { return in_proj.defined(); }
};

struct GatedDeltaDims {
  int64_t num_k_heads = 0, num_v_heads = 0, k_head_dim = 0, v_head_dim = 0, conv_kernel = 0;
  double eps = 1e-6;
  static GatedDeltaDims Of(const model::TransformerConfig& c);
  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t in_proj_rows() const { return conv_dim() + value_dim() + 2 * num_v_heads; }
};

// The layer's token mixer: x [T, H] (already input-normed) -> [T, H] in x's dtype.
at::Tensor GatedDeltaNet(const at::Tensor& x, const GatedDeltaWeights& w, const GatedDeltaDims& d,
                         const VarlenDocs& docs);

// The same for generation: rows offsets[i] .. offsets[i+1]-1 of x continue sequence
// sequences[i] from its state, which they update: conv [S, K-1, conv_dim] holds each sequence's
// last K-1 rows that entered the convolution (x's dtype; zeros for a new sequence), state
// [S, Hv, dk, dv] its recurrent state (fp32). One forward over a whole sequence and the same
// sequence extended piece by piece give the same rows. Extensions where some sequence adds at
// least `chunked_from` rows (prefills, replays) run the chunked form from each sequence's state
// (64-row chunks: a few batched operations per chunk for all sequences at once); shorter ones
// (decoding steps, verification blocks) the recurrent form, token by token.
at::Tensor GatedDeltaNetExtend(const at::Tensor& x, const GatedDeltaWeights& w,
                               const GatedDeltaDims& d, const std::vector<int64_t>& sequences,
                               const std::vector<int64_t>& offsets, at::Tensor* conv,
                               at::Tensor* state, int64_t chunked_from = 32);

// Depthwise causal convolution per document: x [T, C], weight [C, K] ->
// out[t, c] = sum_j weight[c, j] * x[t - (K-1) + j, c] over rows of t's document (zero before its
// start), in fp32, returned in x's dtype; no activation.
at::Tensor CausalConv1dVarlen(const at::Tensor& x, const at::Tensor& weight,
                              const VarlenDocs& docs);

// The scan itself. q, k [T, Hv, dk] (already repeated to the value heads, not yet normalized),
// v [T, Hv, dv], g [T, Hv] (log decay, <= 0), beta [T, Hv]. Returns [T, Hv, dv] in v's dtype;
// computes in fp32 after L2-normalizing q and k (eps 1e-6) and scaling q by dk^-0.5. On CUDA the
// intra-chunk phase and the chunk-to-chunk recurrence run as two kernels (common/kernels/
// gated_delta) where they support the shape, unless `fused` is false; otherwise in ATen
// operations (batched GEMMs and triangular solves, then a loop over the steps).
at::Tensor GatedDeltaRuleChunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& g, const at::Tensor& beta,
                                 const VarlenDocs& docs, int64_t chunk = 64, bool fused = true);
at::Tensor GatedDeltaRuleReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, const at::Tensor& beta,
                                   const VarlenDocs& docs);

}  // namespace dflash::nn

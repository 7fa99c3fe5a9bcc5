// The drafter's output layer and loss fused and chunked (method.md §3.6, §6): logits of the
// frozen lm_head exist only for `chunk_rows` rows at a time, in forward and again (recomputed) in
// backward, so a batch of 8192 query rows against a 151936-token vocabulary never holds the full
// 2.3 GiB logits tensor, and autograd saves only the hidden rows and one fp32 logsumexp per row.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::drafter {

struct WeightedCeResult {
  // 0-dim fp32: sum_i weights[i] * CE(lm_head(hidden[i]), labels[i]); differentiable in hidden.
  at::Tensor numerator;
  // [N] bool: argmax of row i's logits == labels[i] (ties: the first maximum, as at::argmax).
  at::Tensor correct;
  // [N, top_k] int64 when top_k > 0 was asked, else undefined: the indices of row i's top_k
  // logits, largest first (at::topk of the same chunk of logits the loss reads; among equal
  // logits the order is at::topk's). DFlash2's selector takes its candidates from here instead of
  // a second lm_head product (method.md §2.2).
  at::Tensor top_k;
};

// hidden [N, H] floating point (grad flows into it); lm_head [V, H], frozen (no gradient is
// computed for it), the matmul runs in lm_head's dtype and the softmax in fp32; labels [N] int64 in
// [0, V); weights [N] fp32 (rows of weight 0 still get `correct`, and a zero gradient). Throws
// c10::Error on misuse.
//
// On a CUDA device (when built with CUDA) this runs the fused kernel path
// (common/kernels/fused_ce/fused_ce.h: gradient computed in forward, 2 GEMMs per chunk, one chunk
// of logits in lm_head's dtype); elsewhere, and always through ChunkedWeightedCrossEntropy, the
// recomputing chunked path below, which is the reference.
WeightedCeResult WeightedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                                      const at::Tensor& labels, const at::Tensor& weights,
                                      int64_t chunk_rows, int64_t top_k = 0);

// The reference on any device: logits in fp32 per chunk, recomputed in backward (3 GEMMs a chunk).
WeightedCeResult ChunkedWeightedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                                             const at::Tensor& labels, const at::Tensor& weights,
                                             int64_t chunk_rows, int64_t top_k = 0);

// For a loss whose weights depend on the rows' own cross-entropies (D-PACE): one pass over the
// logits gives each row's CE [N] fp32, `correct`, the top_k indices (top_k > 0, as
// WeightedCeResult::top_k) and grad [N, H] in hidden's dtype, d CE_i / d hidden_i at weight 1;
// none of it differentiable. WeightedRowsNumerator then makes sum_i weights[i] * ce[i]
// differentiable in hidden with the weights held constant (its backward scales grad's rows by
// the weights), so that the weights cost no second lm_head product. On CUDA the fused pass
// (common/kernels/fused_ce, FusedCrossEntropyRows); elsewhere fp32 logits a chunk at a time.
struct CrossEntropyRows {
  at::Tensor ce, correct, top_k, grad;
};
CrossEntropyRows CrossEntropyRowsWithGrad(const at::Tensor& hidden, const at::Tensor& lm_head,
                                          const at::Tensor& labels, int64_t chunk_rows,
                                          int64_t top_k = 0);
at::Tensor WeightedRowsNumerator(const at::Tensor& hidden, const CrossEntropyRows& rows,
                                 const at::Tensor& weights);

}  // namespace dflash::drafter

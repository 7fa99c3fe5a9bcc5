// Fused lm_head + weighted cross-entropy on CUDA.
//
// The loss is only ever back-propagated, so the gradient is computed in the FORWARD pass, chunk by
// chunk: logits_c = hidden_c @ lm_head^T (one GEMM in lm_head's dtype, fp32 accumulate), then one
// kernel per row (fused_ce_kernel.cuh) computes logsumexp, the row's CE and argmax, and overwrites
// the logits in place with w * (softmax - onehot(label)), then dHidden_c = dlogits_c @ lm_head
// (second GEMM) [and dLmHead += dlogits_c^T @ hidden_c when asked]. Autograd keeps only dHidden
// (and dLmHead); backward scales them by the incoming scalar gradient. Against the recomputing
// chunked path (weighted_ce.h: 3 GEMMs per chunk and fp32 copies of the logits) this is 2 GEMMs
// and one chunk of logits in lm_head's dtype, the only large temporary.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::kernels {

struct FusedCeResult {
  at::Tensor numerator;  // 0-dim fp32: sum_i w_i * CE_i, differentiable in hidden (and lm_head)
  at::Tensor correct;    // [N] bool: first argmax of row i == labels[i]
  at::Tensor top_k;      // [N, top_k] int64 when top_k > 0, else undefined: row i's top_k logits'
                         // indices, largest first (at::topk of the chunk before the row kernel)
};

// hidden [N, H] on CUDA (fp32, bf16 or fp16; the gradient flows into it); lm_head [V, H] on the
// same device (fp32, bf16 or fp16; the GEMMs run in its dtype); labels [N] int64 in [0, V); weights
// [N] fp32. lm_head gets a gradient only with `lm_head_grad` (it must then require grad).
// top_k > 0 also returns each row's top_k indices from the chunk's logits (in lm_head's dtype),
// read before the row kernel overwrites them with the gradient: DFlash2's selector candidates
// without a second lm_head product. TORCH_CHECKs on misuse.
FusedCeResult FusedWeightedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                                        const at::Tensor& labels, const at::Tensor& weights,
                                        int64_t chunk_rows, bool lm_head_grad = false,
                                        int64_t top_k = 0);

// The same pass at weight 1 and outside autograd, for a loss whose weights depend on the rows'
// cross-entropies (D-PACE, common/drafter/weighted_ce.h CrossEntropyRowsWithGrad): each row's CE
// [N] fp32, `correct`, the top_k indices (top_k > 0) and d CE_i / d hidden_i [N, H] in hidden's
// dtype, in one lm_head product per chunk and one back. TORCH_CHECKs as above.
struct FusedCeRows {
  at::Tensor ce, correct, top_k, grad;
};
FusedCeRows FusedCrossEntropyRows(const at::Tensor& hidden, const at::Tensor& lm_head,
                                  const at::Tensor& labels, int64_t chunk_rows, int64_t top_k = 0);

}  // namespace dflash::kernels

#include "common/drafter/weighted_ce.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#ifdef DFLASH_HAVE_FUSED_CE
#include "common/kernels/fused_ce/fused_ce.h"
#endif

namespace dflash::drafter {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Logits of rows [s, s + m) in fp32: [m, V]. The matmul runs in lm_head's dtype (bf16 compute when
// the frozen head is bf16), the result is widened for the softmax.
at::Tensor ChunkLogits(const at::Tensor& hidden, const at::Tensor& lm_head, int64_t s, int64_t m) {
  at::Tensor h = hidden.narrow(0, s, m).to(lm_head.scalar_type());
  return at::matmul(h, lm_head.t()).to(at::kFloat);
}

// d CE / d logits of rows whose fp32 logits and logsumexp are given: softmax - onehot(label),
// [m, V] fp32 (written over a fresh exp of the logits).
at::Tensor CeLogitGrad(const at::Tensor& logits, const at::Tensor& lse, const at::Tensor& label) {
  at::Tensor probs = at::exp(logits - lse.unsqueeze(1));
  probs.scatter_add_(1, label.unsqueeze(1), at::full({logits.size(0), 1}, -1.0, probs.options()));
  return probs;
}

// The shapes every CE entry point takes (`what` names it in the message).
void CheckCeInputs(const at::Tensor& hidden, const at::Tensor& lm_head, const at::Tensor& labels,
                   int64_t chunk_rows, int64_t top_k, const char* what) {
  TORCH_CHECK(hidden.dim() == 2 && lm_head.dim() == 2 && hidden.size(1) == lm_head.size(1), what,
              ": hidden ", hidden.sizes(), " and lm_head ", lm_head.sizes(),
              " must be [N, H] and [V, H]");
  TORCH_CHECK(
      labels.dim() == 1 && labels.size(0) == hidden.size(0) && labels.scalar_type() == at::kLong,
      what, ": labels must be [", hidden.size(0), "] int64");
  TORCH_CHECK(chunk_rows >= 1, what, ": chunk_rows must be at least 1, got ", chunk_rows);
  TORCH_CHECK(top_k >= 0 && top_k <= lm_head.size(0), what, ": top_k must be in 0..",
              lm_head.size(0), " (the vocabulary), got ", top_k);
}

// Outputs: numerator (0-dim fp32, differentiable), correct ([N] bool) and top ([N, top_k] int64),
// not differentiable.
struct WeightedCeFunction : public torch::autograd::Function<WeightedCeFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& lm_head, const at::Tensor& labels,
                               const at::Tensor& weights, int64_t chunk_rows, int64_t top_k) {
    const int64_t rows = hidden.size(0);
    at::Tensor numerator = at::zeros({}, hidden.options().dtype(at::kFloat));
    at::Tensor lse = at::empty({rows}, hidden.options().dtype(at::kFloat));  // [N]
    at::Tensor correct = at::empty({rows}, hidden.options().dtype(at::kBool));
    at::Tensor top = at::empty({rows, top_k}, hidden.options().dtype(at::kLong));
    for (int64_t s = 0; s < rows; s += chunk_rows) {
      const int64_t m = std::min(chunk_rows, rows - s);
      at::Tensor logits = ChunkLogits(hidden, lm_head, s, m);  // [m, V] fp32
      if (top_k > 0) top.narrow(0, s, m).copy_(std::get<1>(at::topk(logits, top_k, 1)));
      at::Tensor label = labels.narrow(0, s, m);
      at::Tensor chunk_lse = at::logsumexp(logits, {1});
      at::Tensor target = logits.gather(1, label.unsqueeze(1)).squeeze(1);
      numerator += ((chunk_lse - target) * weights.narrow(0, s, m)).sum();
      lse.narrow(0, s, m).copy_(chunk_lse);
      correct.narrow(0, s, m).copy_(at::argmax(logits, 1).eq(label));
    }
    ctx->save_for_backward({hidden, lm_head, labels, weights, lse});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->mark_non_differentiable({correct, top});
    return {numerator, correct, top};
  }

  // d numerator / d logits[i] = w_i * (softmax(logits[i]) - onehot(label_i)); through the frozen
  // lm_head: d / d hidden[i] = that row times lm_head.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &lm_head = saved[1], &labels = saved[2];
    const at::Tensor &weights = saved[3], &lse = saved[4];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    at::Tensor grad_hidden;
    if (grad_outputs[0].defined()) {
      at::Tensor scale = weights * grad_outputs[0].to(at::kFloat);  // [N]
      grad_hidden = at::empty_like(hidden);
      for (int64_t s = 0; s < hidden.size(0); s += chunk_rows) {
        const int64_t m = std::min(chunk_rows, hidden.size(0) - s);
        at::Tensor probs = CeLogitGrad(ChunkLogits(hidden, lm_head, s, m), lse.narrow(0, s, m),
                                       labels.narrow(0, s, m));  // [m, V]
        probs.mul_(scale.narrow(0, s, m).unsqueeze(1));
        grad_hidden.narrow(0, s, m).copy_(at::matmul(probs.to(lm_head.scalar_type()), lm_head));
      }
    }
    return {grad_hidden, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

WeightedCeResult WeightedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                                      const at::Tensor& labels, const at::Tensor& weights,
                                      int64_t chunk_rows, int64_t top_k) {
#ifdef DFLASH_HAVE_FUSED_CE
  if (hidden.is_cuda()) {
    kernels::FusedCeResult r = kernels::FusedWeightedCrossEntropy(
        hidden, lm_head, labels, weights, chunk_rows, /*lm_head_grad=*/false, top_k);
    return WeightedCeResult{r.numerator, r.correct, r.top_k};
  }
#endif
  return ChunkedWeightedCrossEntropy(hidden, lm_head, labels, weights, chunk_rows, top_k);
}

WeightedCeResult ChunkedWeightedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                                             const at::Tensor& labels, const at::Tensor& weights,
                                             int64_t chunk_rows, int64_t top_k) {
  CheckCeInputs(hidden, lm_head, labels, chunk_rows, top_k, "weighted CE");
  TORCH_CHECK(weights.dim() == 1 && weights.size(0) == hidden.size(0) &&
                  weights.scalar_type() == at::kFloat,
              "weighted CE: weights must be [", hidden.size(0), "] fp32");
  variable_list out =
      WeightedCeFunction::apply(hidden, lm_head.detach(), labels, weights, chunk_rows, top_k);
  return WeightedCeResult{out[0], out[1], top_k > 0 ? out[2] : at::Tensor()};
}

namespace {

// sum_i w_i ce_i with d / d hidden_i = w_i grad_i (w, ce and grad given, none differentiable).
struct WeightedRowsFunction : public torch::autograd::Function<WeightedRowsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& ce,
                            const at::Tensor& grad, const at::Tensor& weights) {
    (void)hidden;  // the node's input: its gradient is grad's rows scaled
    ctx->saved_data["grad"] = grad;
    ctx->saved_data["weights"] = weights;
    return (ce * weights).sum();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    at::Tensor grad_hidden;
    if (grad_outputs[0].defined()) {
      const at::Tensor grad = ctx->saved_data["grad"].toTensor();
      const at::Tensor scale =
          ctx->saved_data["weights"].toTensor() * grad_outputs[0].to(at::kFloat);
      // In grad's dtype: no fp32 copy of [N, H] (the fused loss's peak once, 0.375 GiB at
      // N = 8192, H = 4096); the row factors round to it once.
      grad_hidden = grad * scale.to(grad.scalar_type()).unsqueeze(1);
    }
    return {grad_hidden, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

CrossEntropyRows CrossEntropyRowsWithGrad(const at::Tensor& hidden, const at::Tensor& lm_head,
                                          const at::Tensor& labels, int64_t chunk_rows,
                                          int64_t top_k) {
  CheckCeInputs(hidden, lm_head, labels, chunk_rows, top_k, "CE rows");
#ifdef DFLASH_HAVE_FUSED_CE
  if (hidden.is_cuda()) {
    kernels::FusedCeRows r =
        kernels::FusedCrossEntropyRows(hidden, lm_head, labels, chunk_rows, top_k);
    return CrossEntropyRows{r.ce, r.correct, r.top_k, r.grad};
  }
#endif
  at::NoGradGuard no_grad;
  const at::Tensor h = hidden.detach(), head = lm_head.detach();
  const int64_t rows = h.size(0);
  CrossEntropyRows r;
  r.ce = at::empty({rows}, h.options().dtype(at::kFloat));
  r.correct = at::empty({rows}, h.options().dtype(at::kBool));
  r.grad = at::empty_like(h, at::MemoryFormat::Contiguous);
  if (top_k > 0) r.top_k = at::empty({rows, top_k}, h.options().dtype(at::kLong));
  for (int64_t s = 0; s < rows; s += chunk_rows) {
    const int64_t m = std::min(chunk_rows, rows - s);
    const at::Tensor logits = ChunkLogits(h, head, s, m);  // [m, V] fp32
    const at::Tensor label = labels.narrow(0, s, m);
    if (top_k > 0) r.top_k.narrow(0, s, m).copy_(std::get<1>(at::topk(logits, top_k, 1)));
    const at::Tensor lse = at::logsumexp(logits, {1});
    r.ce.narrow(0, s, m).copy_(lse - logits.gather(1, label.unsqueeze(1)).squeeze(1));
    r.correct.narrow(0, s, m).copy_(at::argmax(logits, 1).eq(label));
    const at::Tensor dlogits = CeLogitGrad(logits, lse, label);
    r.grad.narrow(0, s, m).copy_(at::matmul(dlogits.to(head.scalar_type()), head));
  }
  return r;
}

at::Tensor WeightedRowsNumerator(const at::Tensor& hidden, const CrossEntropyRows& rows,
                                 const at::Tensor& weights) {
  TORCH_CHECK(rows.ce.defined() && rows.grad.defined() && rows.grad.sizes() == hidden.sizes(),
              "weighted rows: the rows' CE and gradient must be of hidden ", hidden.sizes());
  TORCH_CHECK(weights.dim() == 1 && weights.size(0) == hidden.size(0),
              "weighted rows: weights must be [", hidden.size(0), "]");
  return WeightedRowsFunction::apply(hidden, rows.ce, rows.grad,
                                     weights.to(rows.ce.device(), at::kFloat).detach());
}

}  // namespace dflash::drafter

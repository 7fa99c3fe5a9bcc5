// The drafter's loss (docs/method.md §3.6, §2.2): the weighted unary cross-entropy over the
// supervised slots, its weights (decay or D-PACE), DFlash2's selector term and the per-slot
// accuracy counts.
#include <ATen/TensorOperators.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/cumprod.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/config/run_spec.h"
#include "common/drafter/drafter_model.h"
#include "common/drafter/weighted_ce.h"
#include "common/nn/torch_status.h"
#include "common/nn/weights.h"

namespace dflash::drafter {

double SelectorAlphaAt(const LossOptions& options, int64_t step) {
  const int64_t into = step - options.selector_warmup_steps;
  if (into < 0) return 0.0;
  if (into >= options.selector_ramp_steps) return options.selector_loss_alpha;
  return options.selector_loss_alpha * static_cast<double>(into + 1) /
         static_cast<double>(options.selector_ramp_steps + 1);
}

at::Tensor DpaceWeights(const at::Tensor& mask, const at::Tensor& ce, double alpha) {
  const at::Tensor m = mask.to(at::kFloat);
  const at::Tensor smooth =
      at::where(m.gt(0), ce.to(at::kFloat).neg().exp() * (1.0 - alpha) + alpha, at::ones_like(m));
  const at::Tensor prefix = smooth.cumprod(1);
  // Suffix sums of m_j P_j: flip, cumulative sum, flip back.
  return (prefix * m).flip({1}).cumsum(1).flip({1}) * m;
}

absl::StatusOr<DrafterLoss> DrafterModel::Loss(const DrafterBatch& batch, const at::Tensor& hidden,
                                               const LossOptions& options) const {
  if (config_.output_multiplier != 1.0 || config_.final_logit_softcapping > 0) {
    return absl::UnimplementedError(
        "training a drafter whose output head is scaled or soft-capped (output_multiplier, "
        "final_logit_softcapping) is not implemented: such a drafter is decoded and evaluated "
        "only (docs/method.md §2.2)");
  }
  const double gamma =
      options.gamma > 0 ? options.gamma : config::DefaultGamma(config_.block_size).value_or(0.0);
  if (gamma <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("gamma: block size ", config_.block_size,
                                                   " has no default; configure it explicitly"));
  }
  if (options.logits_chunk_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits_chunk_rows must be at least 1, got ", options.logits_chunk_rows));
  }
  if (options.weighting == LossWeighting::kDpace &&
      !(options.dpace_alpha > 0 && options.dpace_alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss.dpace_alpha: must be in (0, 1], got ", options.dpace_alpha));
  }
  const int64_t b = config_.block_size;
  try {
    ASSIGN_OR_RETURN(BlockTargets targets, Targets(batch, gamma));
    const int64_t q_rows = targets.labels.size(0);
    if (!hidden.defined() || hidden.dim() != 2 || hidden.size(0) != q_rows ||
        hidden.size(1) != config_.target.hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hidden must be [", q_rows, ", ", config_.target.hidden_size, "], got ",
          nn::ShapeString(hidden.defined() ? hidden.sizes().vec() : std::vector<int64_t>{})));
    }
    // Only supervised rows (w > 0) reach the lm_head: slot 0, padding and unsupervised positions
    // cost nothing there.
    at::Tensor rows = at::nonzero(targets.weights.gt(0)).squeeze(1);  // [S] int64
    const at::Tensor supervised_hidden = hidden.index_select(0, rows.to(hidden.device()));
    const at::Tensor supervised_labels = targets.labels.index_select(0, rows);
    const int64_t top_k = config_.dflash2() ? config_.selector_top_k : 0;
    WeightedCeResult ce;
    if (options.weighting == LossWeighting::kDpace) {
      // The decay's support is the supervised mask; the slots' own confidences weigh them. One
      // pass gives each row's CE and its gradient at weight 1, the weights scale the gradient's
      // rows in the backward (no second lm_head product for the weights).
      const at::Tensor mask = targets.weights.gt(0).to(at::kFloat).view({-1, b});
      CrossEntropyRows row_ce = CrossEntropyRowsWithGrad(
          supervised_hidden, lm_head_, supervised_labels, options.logits_chunk_rows, top_k);
      const at::Tensor ce_all =
          at::zeros({q_rows}, mask.options()).index_copy_(0, rows, row_ce.ce.to(mask.device()));
      targets.weights = DpaceWeights(mask, ce_all.view({-1, b}), options.dpace_alpha).view({-1});
      ce.numerator =
          WeightedRowsNumerator(supervised_hidden, row_ce, targets.weights.index_select(0, rows));
      ce.correct = row_ce.correct;
      ce.top_k = row_ce.top_k;
    } else {
      // DFlash2: the selector's candidates (each row's unary top-k) come out of the same pass.
      ce = WeightedCrossEntropy(supervised_hidden, lm_head_, supervised_labels,
                                targets.weights.index_select(0, rows), options.logits_chunk_rows,
                                top_k);
    }
    at::Tensor slot = rows.remainder(b);
    DrafterLoss loss;
    loss.numerator = ce.numerator;
    loss.denominator = targets.weights.sum();
    loss.slot_total = at::bincount(slot, {}, b);
    at::Tensor correct = ce.correct;
    if (config_.dflash2()) {
      // The selector's K-way loss beside the unary one; correct: the selector's teacher-forced
      // choice is the label (what it drafts), not the unary argmax.
      const at::Tensor predecessors = targets.labels.index_select(0, rows - 1);
      SelectorTerm sel = SelectorLoss(supervised_hidden, supervised_labels, predecessors,
                                      targets.weights.index_select(0, rows), ce.top_k, options);
      loss.numerator = loss.numerator + sel.numerator * options.selector_loss_alpha;
      correct = sel.correct;
    }
    loss.slot_correct = at::bincount(slot.masked_select(correct.to(slot.device())), {}, b);
    return loss;
  } catch (const c10::Error& e) {
    return nn::TorchStatus(e, "drafter loss");
  }
}

}  // namespace dflash::drafter

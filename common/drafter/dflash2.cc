// DFlash2's parts of the drafter (drafter_model.h; docs/method.md §2.2): the grouped dynamic causal
// convolution over each block's slots around a layer's attention and MLP, and the candidate
// selector that reranks the output head's top-k tokens of a slot given the token drafted before it.
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/drafter/drafter_model.h"
#include "common/drafter/lean_ops.h"
#ifdef DFLASH_HAVE_FUSED_BLOCK_CONV
#include "common/kernels/block_conv/block_conv.h"
#endif
#include "common/nn/torch_status.h"
#include "common/nn/weights.h"

namespace dflash::drafter {
namespace {

absl::Status Dflash2FieldError(const std::string& field, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("drafter config: ", field, ": ", msg));
}

}  // namespace

absl::Status ValidateDflash2Config(const DrafterConfig& c) {
  if (!(c.output_multiplier > 0) || !std::isfinite(c.output_multiplier)) {
    return Dflash2FieldError("output_multiplier",
                             absl::StrCat("must be positive, got ", c.output_multiplier));
  }
  if (!(c.final_logit_softcapping >= 0) || !std::isfinite(c.final_logit_softcapping)) {
    return Dflash2FieldError("final_logit_softcapping", absl::StrCat("must be >= 0 (0: off), got ",
                                                                     c.final_logit_softcapping));
  }
  if (!(c.input_embedding_scale > 0) || !std::isfinite(c.input_embedding_scale)) {
    return Dflash2FieldError("input_embedding_scale",
                             absl::StrCat("must be positive, got ", c.input_embedding_scale));
  }
  if (c.conv_kernel_size < 0) {
    return Dflash2FieldError("conv_kernel_size",
                             absl::StrCat("must be >= 0, got ", c.conv_kernel_size));
  }
  if (c.dflash2()) {
    if (c.conv_kernel_size > c.block_size) {
      return Dflash2FieldError(
          "conv_kernel_size",
          absl::StrCat(c.conv_kernel_size, " exceeds the block size ", c.block_size));
    }
    if (c.conv_group_size < 1 || c.target.hidden_size % c.conv_group_size != 0) {
      return Dflash2FieldError("conv_group_size",
                               absl::StrCat(c.conv_group_size, " does not divide the hidden size ",
                                            c.target.hidden_size));
    }
    if (c.selector_rank < 1) {
      return Dflash2FieldError("selector_rank",
                               absl::StrCat("must be >= 1, got ", c.selector_rank));
    }
    if (c.selector_top_k < 1 || c.selector_top_k > c.target.vocab_size) {
      return Dflash2FieldError("selector_top_k",
                               absl::StrCat("must be in 1..", c.target.vocab_size,
                                            " (the vocabulary), got ", c.selector_top_k));
    }
  }
  return absl::OkStatus();
}

at::Tensor BlockConvolution(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& base,
                            int64_t block_size, int64_t group_size) {
#ifdef DFLASH_HAVE_FUSED_BLOCK_CONV
  // On CUDA one pass each way (common/kernels/block_conv); the composition below is its reference.
  if (kernels::SupportsFusedBlockConv(x, delta, base, block_size, group_size)) {
    return kernels::FusedBlockConvolution(x, delta, base, block_size, group_size);
  }
#endif
  const int64_t q = x.size(0), h = x.size(1), kernel = base.size(0);
  const int64_t n = q / block_size, groups = h / group_size;
  TORCH_CHECK(n * block_size == q, "block convolution over ", q, " rows, not blocks of ",
              block_size);
  const at::Tensor xb = x.reshape({n, block_size, groups, group_size});
  const at::Tensor db = delta.reshape({n, block_size, kernel, groups});
  at::Tensor out;
  for (int64_t t = 0; t < kernel; ++t) {
    // Slot k reads slot k - t of its own block; the first t slots have nothing there.
    const at::Tensor shifted = t == 0
                                   ? xb
                                   : at::cat({at::zeros({n, t, groups, group_size}, xb.options()),
                                              xb.narrow(1, 0, block_size - t)},
                                             1);
    const at::Tensor coefficient =
        base.select(0, t).to(x.scalar_type()).view({1, 1, groups, group_size}) +
        db.select(2, t).unsqueeze(-1);
    out = t == 0 ? shifted * coefficient : out + shifted * coefficient;
  }
  return out.reshape({q, h});
}

std::pair<at::Tensor, at::Tensor> DrafterModel::ConvIn(const at::Tensor& h, const at::Tensor& base,
                                                       const at::Tensor& proj) const {
  const int64_t rows = h.size(0), kernel = config_.conv_kernel_size;
  const int64_t groups = config_.target.hidden_size / config_.conv_group_size;
  // One projection gives both sides' kernel offsets: [rows, 2, Kc, G].
  const at::Tensor delta = CastLinear(h, proj, compute_dtype()).view({rows, 2, kernel, groups});
  return {BlockConvolution(h, delta.select(1, 0), base.select(0, 0), config_.block_size,
                           config_.conv_group_size),
          delta.select(1, 1)};
}

at::Tensor DrafterModel::ConvOut(const at::Tensor& y, const at::Tensor& delta,
                                 const at::Tensor& base) const {
  return BlockConvolution(y, delta, base.select(0, 1), config_.block_size, config_.conv_group_size);
}

absl::StatusOr<at::Tensor> DrafterModel::SelectCandidates(const at::Tensor& hidden,
                                                          const std::vector<int64_t>& anchor_tokens,
                                                          const PickFn& pick,
                                                          at::Tensor* candidates,
                                                          std::vector<at::Tensor>* scores) const {
  if (!config_.dflash2()) {
    return absl::FailedPreconditionError(
        "the candidate selector is DFlash2's; this is a DFlash "
        "drafter");
  }
  const int64_t n = static_cast<int64_t>(anchor_tokens.size()), b = config_.block_size;
  if (!hidden.defined() || hidden.dim() != 2 || hidden.size(0) != n * b) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden must hold ", n, " blocks of ", b, " rows, got ",
        nn::ShapeString(hidden.defined() ? hidden.sizes().vec() : std::vector<int64_t>{})));
  }
  ASSIGN_OR_RETURN(at::Tensor logits, Logits(hidden));
  try {
    at::NoGradGuard no_grad;
    const int64_t v = logits.size(1), k = config_.selector_top_k;
    const at::Tensor slots = logits.view({n, b, v}).narrow(1, 1, b - 1).to(at::kFloat);
    auto [unary, cand] = at::topk(slots, k, -1);  // [n, B-1, K]
    const c10::ScalarType dtype = compute_dtype();
    const at::Tensor rows = hidden.view({n, b, -1}).narrow(1, 1, b - 1).to(dtype);
    const at::Tensor projected =
        at::matmul(rows, selector_projection_.to(dtype).t()).to(at::kFloat);  // [n, B-1, R]
    const at::Tensor pred_table = predecessor_codebook_.to(at::kFloat);
    const at::Tensor succ_table = successor_codebook_.to(at::kFloat);
    at::Tensor predecessor =
        at::tensor(anchor_tokens, at::TensorOptions().dtype(at::kLong)).to(hidden.device());
    std::vector<at::Tensor> path;
    for (int64_t pos = 0; pos < b - 1; ++pos) {
      const at::Tensor context =
          at::embedding(pred_table, predecessor) * projected.select(1, pos);         // [n, R]
      const at::Tensor successors = at::embedding(succ_table, cand.select(1, pos));  // [n, K, R]
      const at::Tensor s =
          unary.select(1, pos) + (successors * context.unsqueeze(1)).sum(-1);  // [n, K]
      if (scores != nullptr) scores->push_back(s);
      const at::Tensor index = pick(s).to(hidden.device(), at::kLong).view({n, 1});
      predecessor = cand.select(1, pos).gather(-1, index).squeeze(-1);
      path.push_back(predecessor);
    }
    if (candidates != nullptr) *candidates = cand;
    return at::stack(path, 1).to(at::kCPU);
  } catch (const c10::Error& e) {
    return nn::TorchStatus(e, "drafter candidate selector");
  }
}

DrafterModel::SelectorTerm DrafterModel::SelectorLoss(
    const at::Tensor& hidden, const at::Tensor& labels, const at::Tensor& predecessors,
    const at::Tensor& weights, const at::Tensor& top_k, const LossOptions& options) const {
  const int64_t s = hidden.size(0), k = config_.selector_top_k;
  const c10::Device device = hidden.device();
  const at::TensorOptions long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor label = labels.to(device, at::kLong);
  const at::Tensor w = weights.to(device, at::kFloat);
  // Each row's unary top-k (no gradient), read by the unary loss from its own chunks of logits.
  TORCH_CHECK(top_k.defined() && top_k.dim() == 2 && top_k.size(0) == s && top_k.size(1) == k,
              "selector loss: the unary top-k must be [", s, ", ", k, "]");
  const at::Tensor cand = top_k.to(device, at::kLong);
  // The training candidates: the label replaces the weakest where the top-k lacks it, so that
  // every row has a K-way target (the serving set is the top-k itself).
  const at::Tensor match = cand.eq(label.unsqueeze(1));
  const at::Tensor contains = match.any(1);
  at::Tensor train = cand.clone();
  train.select(1, k - 1).copy_(at::where(contains, cand.select(1, k - 1), label));
  const at::Tensor target =
      at::where(contains, match.to(at::kLong).argmax(1), at::full({s}, k - 1, long_opts));
  // The candidates' logits, differentiable in hidden: the K lm_head rows of each row, gathered a
  // chunk at a time (again in the backward, not kept).
  const at::Tensor unary =
      GatheredRowLogits(hidden, lm_head_, train, std::max<int64_t>(1, options.logits_chunk_rows));
  const at::Tensor projected =
      CastLinear(hidden, selector_projection_, compute_dtype()).to(at::kFloat);  // [S, R]
  const at::Tensor context =
      at::embedding(predecessor_codebook_, predecessors.to(device, at::kLong)).to(at::kFloat) *
      projected;
  const at::Tensor successors = at::embedding(successor_codebook_, train).to(at::kFloat);
  const at::Tensor scores = unary + (successors * context.unsqueeze(1)).sum(-1);  // [S, K]
  const at::Tensor ce = at::logsumexp(scores, 1) - scores.gather(1, target.unsqueeze(1)).squeeze(1);
  SelectorTerm term;
  term.numerator = (ce * w).sum();
  term.correct = scores.detach().argmax(1).eq(target) & contains;
  return term;
}

}  // namespace dflash::drafter

#include "common/drafter/drafter_attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#ifdef DFLASH_HAVE_FUSED_ATTN
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/kernels/dflash_attn/dflash_attn.h"
#endif

namespace dflash::drafter {

struct KernelPlanCache {
  std::mutex mu;
#ifdef DFLASH_HAVE_FUSED_ATTN
  // One plan per layer kind of the step (full attention; sliding window), built on first use.
  std::vector<kernels::DflashAttnPlan> plans;
#endif
};

namespace {

void CheckShapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const BlockMask& mask) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "drafter attention: q, k, v must be [rows, heads, head_dim]");
  TORCH_CHECK(k.sizes() == v.sizes(), "drafter attention: k ", k.sizes(), " and v ", v.sizes(),
              " differ");
  TORCH_CHECK(q.size(2) == k.size(2), "drafter attention: head_dim of q ", q.sizes(), " and k ",
              k.sizes(), " differ");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "drafter attention: ", q.size(1),
              " query heads are not a multiple of ", k.size(1), " kv heads");
  const int64_t n = mask.anchors.size(0), b = mask.block_size, t = mask.doc_ids.size(0);
  TORCH_CHECK(q.size(0) == n * b, "drafter attention: q has ", q.size(0), " rows, expected ", n,
              " blocks of ", b);
  TORCH_CHECK(k.size(0) == t + n * b, "drafter attention: k has ", k.size(0),
              " rows, expected T + Q = ", t, " + ", n * b);
}

// Attention of blocks [j0, j0 + c) -> [c*B, Hq, D].
at::Tensor AttendChunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const BlockMask& mask, double scale, int64_t j0, int64_t c) {
  const int64_t b = mask.block_size, t = mask.doc_ids.size(0);
  const int64_t hq = q.size(1), hkv = k.size(1), d = q.size(2), g = hq / hkv;
  // Query heads grouped by the kv head they read: [c, Hkv, G, B, D].
  at::Tensor qc = q.narrow(0, j0 * b, c * b).reshape({c, b, hkv, g, d}).permute({0, 2, 3, 1, 4});
  // Context rows shared by every block: ctx(x) [Hkv, 1, T, D] (a leading 1 is added below);
  // each block's own rows: own(x) [c, Hkv, 1, B, D].
  auto ctx = [&](const at::Tensor& x) { return x.narrow(0, 0, t).permute({1, 0, 2}).unsqueeze(1); };
  auto own = [&](const at::Tensor& x) {
    return x.narrow(0, t + j0 * b, c * b)
        .reshape({c, b, hkv, d})
        .permute({0, 2, 1, 3})
        .unsqueeze(2);
  };
  at::Tensor scores = at::cat({at::matmul(qc, ctx(k).unsqueeze(0).transpose(-1, -2)),
                               at::matmul(qc, own(k).transpose(-1, -2))},
                              -1) *
                      scale;  // [c, Hkv, G, B, T + B]

  // visible [c, T + B]: the same row for every slot and head of a block.
  at::Tensor anchors = mask.anchors.narrow(0, j0, c);
  at::Tensor valid = anchors.ge(0);
  at::Tensor anchor_row = anchors.clamp_min(0);
  at::Tensor rows = at::arange(t, anchors.options());
  at::Tensor anchor_doc = t > 0 ? mask.doc_ids.index_select(0, anchor_row) : anchor_row;
  at::Tensor ctx_visible = mask.doc_ids.unsqueeze(0).eq(anchor_doc.unsqueeze(1)) &
                           rows.unsqueeze(0).lt(anchors.unsqueeze(1)) & valid.unsqueeze(1);
  at::Tensor own_visible = valid.unsqueeze(1).expand({c, b});
  if (mask.block_lengths.defined()) {
    own_visible = own_visible & at::arange(b, anchors.options())
                                    .unsqueeze(0)
                                    .lt(mask.block_lengths.narrow(0, j0, c).unsqueeze(1));
  }
  // visible [c, B, T + B]: per slot where a sliding layer narrows it, else the block's row.
  at::Tensor visible;
  if (mask.causal || mask.window > 0) {
    at::Tensor slot = at::arange(b, anchors.options());  // k, and k' for the block's own rows
    at::Tensor ctx3 = ctx_visible.unsqueeze(1).expand({c, b, t});
    at::Tensor own3 = own_visible.unsqueeze(1).expand({c, b, b});
    if (mask.causal) own3 = own3 & slot.view({1, 1, b}).le(slot.view({1, b, 1}));
    if (mask.window > 0) {
      // Context row c at distance (a_j + k) - c, block row k' at k - k'.
      at::Tensor first = anchors.view({c, 1, 1}) + slot.view({1, b, 1}) - (mask.window - 1);
      ctx3 = ctx3 & rows.view({1, 1, t}).ge(first);
      own3 = own3 & (slot.view({1, b, 1}) - slot.view({1, 1, b})).lt(mask.window);
    }
    visible = at::cat({ctx3, own3}, 2);
  } else {
    visible = at::cat({ctx_visible, own_visible}, 1).unsqueeze(1).expand({c, b, t + b});
  }
  // A row with nothing visible is computed as if everything were visible (finite softmax, no NaN
  // in forward or backward) and then zeroed.
  at::Tensor any = visible.any(2, /*keepdim=*/true);  // [c, B, 1]
  at::Tensor keep = (visible | any.logical_not()).view({c, 1, 1, b, t + b});
  scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  probs = probs * any.view({c, 1, 1, b, 1}).to(probs.scalar_type());
  at::Tensor out = at::matmul(probs.narrow(-1, 0, t), ctx(v).unsqueeze(0)) +
                   at::matmul(probs.narrow(-1, t, b), own(v));  // [c, Hkv, G, B, D]
  return out.permute({0, 3, 1, 2, 4}).reshape({c * b, hq, d});
}

}  // namespace

BlockMask BuildBlockMask(const at::Tensor& anchors, const at::Tensor& doc_ids, int64_t block_size,
                         const at::Tensor& block_lengths) {
  TORCH_CHECK(anchors.dim() == 1 && anchors.scalar_type() == at::kLong,
              "anchors must be a 1-D int64 tensor");
  TORCH_CHECK(doc_ids.dim() == 1 && doc_ids.scalar_type() == at::kLong,
              "doc_ids must be a 1-D int64 tensor");
  TORCH_CHECK(block_size >= 1, "block_size must be at least 1, got ", block_size);
  BlockMask mask;
  mask.kernel_plan = std::make_shared<KernelPlanCache>();
  mask.block_size = block_size;
  mask.anchors = anchors;
  mask.doc_ids = doc_ids;
  if (block_lengths.defined()) {
    TORCH_CHECK(block_lengths.dim() == 1 && block_lengths.scalar_type() == at::kLong &&
                    block_lengths.size(0) == anchors.size(0),
                "block_lengths must be a 1-D int64 tensor with one entry per anchor");
    mask.block_lengths = block_lengths.to(anchors.device());
  }
  if (doc_ids.size(0) == 0) {
    mask.ctx_begin = at::zeros_like(anchors);
    return mask;
  }
  // doc_ids is nondecreasing: the first row of a document is its left insertion point.
  at::Tensor anchor_doc = doc_ids.index_select(0, anchors.clamp_min(0));
  at::Tensor begin = at::searchsorted(doc_ids, anchor_doc);
  mask.ctx_begin = at::where(anchors.ge(0), begin, at::zeros_like(begin));
  return mask;
}

at::Tensor ReferenceDrafterAttention::Forward(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, const BlockMask& mask,
                                              double scale) const {
  CheckShapes(q, k, v, mask);
  const int64_t n = mask.anchors.size(0), b = mask.block_size, t = mask.doc_ids.size(0);
  if (n == 0) return q.new_empty(q.sizes());
  const int64_t per_block = q.size(1) * b * (t + b);
  const int64_t chunk = std::max<int64_t>(1, max_score_elements_ / std::max<int64_t>(1, per_block));
  std::vector<at::Tensor> parts;
  for (int64_t j0 = 0; j0 < n; j0 += chunk) {
    parts.push_back(AttendChunk(q, k, v, mask, scale, j0, std::min(chunk, n - j0)));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, 0);
}

bool FusedDrafterAttention::Supports(const at::Tensor& q, const at::Tensor& k,
                                     const BlockMask& mask) {
#ifdef DFLASH_HAVE_FUSED_ATTN
  // A window below the block size would hide block keys too: the reference takes it.
  return mask.kernel_plan != nullptr && mask.block_size <= 64 && !mask.block_lengths.defined() &&
         (mask.window == 0 || mask.window >= mask.block_size) &&
         kernels::SupportsFusedDflashAttention(q, k);
#else
  return false;
#endif
}

bool FusedDrafterAttention::Qualifies(c10::Device device, c10::ScalarType dtype, int64_t head_dim,
                                      int64_t group, int64_t block_size, int64_t window) {
#ifdef DFLASH_HAVE_FUSED_ATTN
  return block_size <= 64 && (window == 0 || window >= block_size) &&
         kernels::FusedDflashAttentionQualifies(device, dtype, head_dim, group);
#else
  return false;
#endif
}

std::string AttentionKernelReport(const AttentionGeometry& g, const std::vector<int64_t>& windows,
                                  bool fused) {
  auto why = [&](int64_t window) -> std::string {
    if (!fused) return "set by the caller";
    if (!g.device.is_cuda()) return "the drafter is on the CPU";
    if (g.dtype != c10::ScalarType::BFloat16) {
      return absl::StrCat("compute dtype ", c10::toString(g.dtype));
    }
    if (window > 0 && window < g.block_size) {
      return absl::StrCat("sliding window ", window, " below the block size ", g.block_size);
    }
    return absl::StrCat("no kernel for head_dim ", g.head_dim, " with ", g.group,
                        " query heads per kv head");
  };
  std::vector<int64_t> reference;
  std::string reason;
  for (size_t i = 0; i < windows.size(); ++i) {
    if (fused && FusedDrafterAttention::Qualifies(g.device, g.dtype, g.head_dim, g.group,
                                                  g.block_size, windows[i])) {
      continue;
    }
    reference.push_back(static_cast<int64_t>(i));
    reason = why(windows[i]);
  }
  if (reference.empty()) return "attention: fused kernels in every layer";
  if (reference.size() == windows.size()) {
    return absl::StrCat("attention: reference in every layer (", reason, ")");
  }
  return absl::StrCat("attention: fused kernels; reference in layer(s) ",
                      absl::StrJoin(reference, ", "), " (", reason, ")");
}

at::Tensor FusedDrafterAttention::Forward(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const BlockMask& mask,
                                          double scale) const {
  if (!Supports(q, k, mask)) return reference_.Forward(q, k, v, mask, scale);
#ifdef DFLASH_HAVE_FUSED_ATTN
  CheckShapes(q, k, v, mask);
  const int64_t group = q.size(1) / k.size(1);
  kernels::DflashAttnPlan plan;
  {
    const std::lock_guard<std::mutex> lock(mask.kernel_plan->mu);
    auto& plans = mask.kernel_plan->plans;
    auto cached = std::find_if(plans.begin(), plans.end(), [&](const kernels::DflashAttnPlan& x) {
      return x.group == group && x.fwd_items.device() == q.device() && x.window == mask.window &&
             x.block_causal == mask.causal;
    });
    if (cached == plans.end()) {
      plans.push_back(kernels::MakeDflashAttnPlan(mask.anchors, mask.ctx_begin,
                                                  mask.doc_ids.size(0), mask.block_size, group,
                                                  q.device(), mask.window, mask.causal));
      cached = plans.end() - 1;
    }
    plan = *cached;
  }
  return kernels::FusedDflashAttention(q, k, v, plan, scale);
#else
  return reference_.Forward(q, k, v, mask, scale);
#endif
}

}  // namespace dflash::drafter

#include "common/drafter/drafter_attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
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

// The context rows each block can see: block j reads rows [lo[j], lo[j] + count[j])
// (ctx_begin .. anchor - 1 of its own document; a sliding window's first slot starts no earlier
// than anchor - window + 1), count 0 for padding.
struct VisibleRows {
  std::vector<int64_t> lo, count;
};

VisibleRows RowsOf(const int64_t* anchor, const int64_t* begin, int64_t window, int64_t n) {
  VisibleRows r;
  for (int64_t j = 0; j < n; ++j) {
    int64_t lo = begin[j], hi = anchor[j];
    if (window > 0) lo = std::max(lo, hi - (window - 1));
    if (anchor[j] < 0 || hi < lo) lo = hi = 0;
    r.lo.push_back(lo);
    r.count.push_back(hi - lo);
  }
  return r;
}

// Attention of blocks [j0, j0 + c) -> [c*B, Hq, D]. Each block scores only the context rows it
// can see (`rows`), gathered into [c, m] (m: the chunk's largest count) with the shorter blocks'
// tails masked, and its own B rows: the cost is the chunk's blocks times its longest visible
// context, not the batch's whole context (speculative decoding packs one block per sequence,
// each seeing its own sequence only).
at::Tensor AttendChunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const BlockMask& mask, double scale, int64_t j0, int64_t c,
                       const VisibleRows& rows, int64_t m) {
  const int64_t b = mask.block_size, all = mask.doc_ids.size(0);
  const int64_t hq = q.size(1), hkv = k.size(1), d = q.size(2), g = hq / hkv;
  // Query heads grouped by the kv head they read: [c, Hkv, G, B, D].
  at::Tensor qc = q.narrow(0, j0 * b, c * b).reshape({c, b, hkv, g, d}).permute({0, 2, 3, 1, 4});
  // The visible context rows' indices [c, m] (past a block's count: its first row, masked).
  std::vector<int64_t> index(static_cast<size_t>(c * m));
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t r = 0; r < m; ++r) {
      const int64_t lo = rows.lo[j0 + j], count = rows.count[j0 + j];
      index[static_cast<size_t>(j * m + r)] = lo + (r < count ? r : 0);
    }
  }
  const at::TensorOptions long_opts = mask.anchors.options();
  const at::Tensor row = at::tensor(index, at::kLong).to(long_opts.device()).view({c, m});
  const at::Tensor count =
      at::tensor(std::vector<int64_t>(rows.count.begin() + j0, rows.count.begin() + j0 + c),
                 at::kLong)
          .to(long_opts.device());
  // ctx(x) [c, Hkv, 1, m, D]: each block's visible context rows; own(x) [c, Hkv, 1, B, D].
  auto ctx = [&](const at::Tensor& x) {
    return x.index_select(0, row.view({-1}))
        .view({c, m, hkv, d})
        .permute({0, 2, 1, 3})
        .unsqueeze(2);
  };
  auto own = [&](const at::Tensor& x) {
    return x.narrow(0, all + j0 * b, c * b)
        .reshape({c, b, hkv, d})
        .permute({0, 2, 1, 3})
        .unsqueeze(2);
  };
  const at::Tensor kc = ctx(k), vc = ctx(v);
  at::Tensor scores =
      at::cat({at::matmul(qc, kc.transpose(-1, -2)), at::matmul(qc, own(k).transpose(-1, -2))},
              -1) *
      scale;  // [c, Hkv, G, B, m + B]

  // visible [c, m + B]: the same row for every slot and head of a block.
  at::Tensor anchors = mask.anchors.narrow(0, j0, c);
  at::Tensor valid = anchors.ge(0);
  at::Tensor ctx_visible = at::arange(m, long_opts).unsqueeze(0).lt(count.unsqueeze(1));
  at::Tensor own_visible = valid.unsqueeze(1).expand({c, b});
  if (mask.block_lengths.defined()) {
    own_visible =
        own_visible &
        at::arange(b, long_opts).unsqueeze(0).lt(mask.block_lengths.narrow(0, j0, c).unsqueeze(1));
  }
  // visible [c, B, m + B]: per slot where a sliding layer narrows it, else the block's row.
  at::Tensor visible;
  if (mask.causal || mask.window > 0) {
    at::Tensor slot = at::arange(b, long_opts);  // k, and k' for the block's own rows
    at::Tensor ctx3 = ctx_visible.unsqueeze(1).expand({c, b, m});
    at::Tensor own3 = own_visible.unsqueeze(1).expand({c, b, b});
    if (mask.causal) own3 = own3 & slot.view({1, 1, b}).le(slot.view({1, b, 1}));
    if (mask.window > 0) {
      // Context row r at distance (a_j + k) - r, block row k' at k - k'.
      at::Tensor first = anchors.view({c, 1, 1}) + slot.view({1, b, 1}) - (mask.window - 1);
      ctx3 = ctx3 & row.view({c, 1, m}).ge(first);
      own3 = own3 & (slot.view({1, b, 1}) - slot.view({1, 1, b})).lt(mask.window);
    }
    visible = at::cat({ctx3, own3}, 2);
  } else {
    visible = at::cat({ctx_visible, own_visible}, 1).unsqueeze(1).expand({c, b, m + b});
  }
  // A row with nothing visible is computed as if everything were visible (finite softmax, no NaN
  // in forward or backward) and then zeroed.
  at::Tensor any = visible.any(2, /*keepdim=*/true);  // [c, B, 1]
  at::Tensor keep = (visible | any.logical_not()).view({c, 1, 1, b, m + b});
  scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  probs = probs * any.view({c, 1, 1, b, 1}).to(probs.scalar_type());
  at::Tensor out = at::matmul(probs.narrow(-1, 0, m), vc) +
                   at::matmul(probs.narrow(-1, m, b), own(v));  // [c, Hkv, G, B, D]
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
  const int64_t n = mask.anchors.size(0), b = mask.block_size;
  if (n == 0) return q.new_empty(q.sizes());
  // Each block scores only the context rows it can see (AttendChunk): a batch of many short
  // documents (speculative decoding packs one block per sequence) costs the sum of what its
  // blocks see, not their count times the batch's context. Blocks join a chunk while its scores,
  // [blocks, Hq, B, longest visible context + B], stay within max_score_elements.
  const at::Tensor anchors = mask.anchors.to(at::kCPU).contiguous();
  const at::Tensor begins =
      (mask.ctx_begin.defined() ? mask.ctx_begin : at::zeros_like(mask.anchors))
          .to(at::kCPU)
          .contiguous();
  const int64_t* anchor = anchors.data_ptr<int64_t>();
  const int64_t* begin = begins.data_ptr<int64_t>();
  const int64_t per_row = q.size(1) * b;  // scores per visible row of one block
  const VisibleRows rows = RowsOf(anchor, begin, mask.window, n);
  std::vector<at::Tensor> parts;
  for (int64_t j0 = 0; j0 < n;) {
    int64_t c = 1, most = rows.count[j0];
    while (j0 + c < n) {
      const int64_t longer = std::max(most, rows.count[j0 + c]);
      if ((c + 1) * per_row * (longer + b) > max_score_elements_) break;
      most = longer;
      ++c;
    }
    parts.push_back(AttendChunk(q, k, v, mask, scale, j0, c, rows, most));
    j0 += c;
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

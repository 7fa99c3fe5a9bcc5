// DrafterModel::ForwardCached: the drafter's forward for speculative decoding with each
// sequence's context keys and values kept between blocks (DrafterKvCache). Forward recomputes,
// at every block, the fc projection of the whole context and each layer's context keys and
// values; here a context row is projected once, when it arrives, and each block computes only its
// own B rows. The attention, its mask (full or sliding layers, short blocks) and the packed layout
// are Forward's, so the result is Forward's (tests/drafter/drafter_cache_test.cc).
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/drafter/drafter_model.h"
#include "common/drafter/drafter_prepared.h"
#include "common/drafter/lean_ops.h"
#include "common/nn/layers.h"
#include "common/nn/torch_status.h"

namespace dflash::drafter {
namespace {

absl::Status CheckBlocks(const std::vector<CachedBlock>& blocks, const DrafterConfig& config,
                         int64_t feature_dim) {
  for (size_t j = 0; j < blocks.size(); ++j) {
    const CachedBlock& c = blocks[j];
    if (c.cache == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("block ", j, ": no cache"));
    if (c.new_features.defined() &&
        (c.new_features.dim() != 2 || c.new_features.size(1) != feature_dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", j, ": new_features must be [m, ", feature_dim, "]"));
    }
    if (c.block_length < 0 || c.block_length > config.block_size) {
      return absl::InvalidArgumentError(absl::StrCat("block ", j, ": block_length ", c.block_length,
                                                     " outside [0, ", config.block_size, "]"));
    }
    if (c.anchor_token < 0 || c.anchor_token >= config.target.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", j, ": anchor token ", c.anchor_token, " outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

// Grows every layer's buffers of `cache` to at least `need` rows (the first time to `reserve` when
// that is more; later by half), keeping the rows held.
void Reserve(DrafterKvCache* cache, int64_t need, int64_t layers, int64_t kv_heads,
             int64_t head_dim, const at::TensorOptions& options) {
  const int64_t capacity = cache->k.empty() ? 0 : cache->k.front().size(0);
  if (capacity >= need) return;
  const int64_t grown = std::max({need, cache->reserve, capacity + capacity / 2});
  if (cache->k.empty()) {
    cache->k.assign(static_cast<size_t>(layers), at::Tensor());
    cache->v.assign(static_cast<size_t>(layers), at::Tensor());
  }
  for (std::vector<at::Tensor>* buffers : {&cache->k, &cache->v}) {
    for (at::Tensor& b : *buffers) {
      at::Tensor bigger = at::empty({grown, kv_heads, head_dim}, options);
      if (cache->rows > 0) bigger.narrow(0, 0, cache->rows).copy_(b.narrow(0, 0, cache->rows));
      b = bigger;
    }
  }
}

// Keys or values of one layer in the packed layout of ForwardCached: per sequence its context
// rows, then its anchor's row (zeros: masked, but it must be finite), then every block's rows
// (`block_rows`, [n * B, Hkv, D]). One sequence: written into its buffer's scratch and read in
// place; several: one copy.
at::Tensor PackedRows(const std::vector<CachedBlock>& blocks,
                      std::vector<at::Tensor> DrafterKvCache::*which, size_t layer,
                      const at::Tensor& block_rows) {
  if (blocks.size() == 1) {
    const at::Tensor& buffer = (blocks[0].cache->*which)[layer];
    const int64_t rows = blocks[0].cache->rows, q = block_rows.size(0);
    buffer.narrow(0, rows, 1).zero_();
    buffer.narrow(0, rows + 1, q).copy_(block_rows);
    return buffer.narrow(0, 0, rows + 1 + q);
  }
  const at::Tensor anchor_row =
      at::zeros({1, block_rows.size(1), block_rows.size(2)}, block_rows.options());
  std::vector<at::Tensor> parts;
  for (const CachedBlock& block : blocks) {
    if (block.cache->rows > 0) {
      parts.push_back((block.cache->*which)[layer].narrow(0, 0, block.cache->rows));
    }
    parts.push_back(anchor_row);
  }
  parts.push_back(block_rows);
  return at::cat(parts, 0);
}

}  // namespace

DrafterBatch DecodingBatch(const std::vector<at::Tensor>& contexts,
                           const std::vector<std::vector<int64_t>>& tokens,
                           const std::vector<int64_t>& block_lengths, int64_t block_size) {
  std::vector<at::Tensor> features;
  std::vector<int64_t> ids, positions, anchors, lengths;
  std::vector<int32_t> cu = {0};
  bool short_block = false;
  for (size_t j = 0; j < contexts.size(); ++j) {
    const int64_t length = j < block_lengths.size() && block_lengths[j] > 0
                               ? std::min(block_lengths[j], block_size)
                               : block_size;
    lengths.push_back(length);
    short_block |= length < block_size;
    features.push_back(contexts[j]);
    features.push_back(at::zeros({1, contexts[j].size(1)}, contexts[j].options()));
    const int64_t n = static_cast<int64_t>(tokens[j].size());
    for (int64_t i = 0; i < n; ++i) positions.push_back(i);
    ids.insert(ids.end(), tokens[j].begin(), tokens[j].end());
    anchors.push_back(cu.back() + n - 1);
    cu.push_back(cu.back() + static_cast<int32_t>(n));
  }
  const at::TensorOptions long_opts = at::TensorOptions().dtype(at::kLong);
  DrafterBatch batch;
  batch.features = at::cat(features, 0);
  batch.input_ids = at::tensor(ids, long_opts);
  batch.positions = at::tensor(positions, long_opts);
  batch.cu_seqlens = at::tensor(cu, at::TensorOptions().dtype(at::kInt));
  batch.anchors = at::tensor(anchors, long_opts);
  if (short_block) batch.block_lengths = at::tensor(lengths, long_opts);
  return batch;
}

void DrafterModel::ExtendCaches(const std::vector<CachedBlock>& blocks) const {
  const model::TransformerConfig& c = config_.target;
  const c10::ScalarType dtype = compute_dtype();
  const c10::Device device = options_.device;
  std::vector<at::Tensor> parts;
  std::vector<int64_t> positions, counts;
  for (const CachedBlock& block : blocks) {
    const int64_t m = block.new_features.defined() ? block.new_features.size(0) : 0;
    counts.push_back(m);
    if (m == 0) continue;
    parts.push_back(block.new_features);
    for (int64_t r = 0; r < m; ++r) positions.push_back(block.cache->rows + r);
  }
  const int64_t layers = static_cast<int64_t>(layers_.size());
  const at::TensorOptions buffer_options = at::TensorOptions().dtype(dtype).device(device);
  for (size_t j = 0; j < blocks.size(); ++j) {
    // Room for the new rows, the anchor's row and a block (ForwardCached's scratch).
    Reserve(blocks[j].cache, blocks[j].cache->rows + counts[j] + 1 + config_.block_size, layers,
            c.num_key_value_heads, c.head_dim, buffer_options);
  }
  if (parts.empty()) return;
  // ctx [M, H] = hidden_norm(fc(features)) of every new row, one product for all sequences.
  at::Tensor ctx = nn::RmsNorm(CastLinear(at::cat(parts, 0).to(device).to(dtype), fc_, dtype),
                               hidden_norm_.to(dtype), c.rms_norm_eps);
  const nn::RopeTables rope = nn::MakeRopeTables(
      at::tensor(positions, at::TensorOptions().dtype(at::kLong)).to(device), inv_freq_, dtype);
  const int64_t rows = ctx.size(0), hkv = c.num_key_value_heads, d = c.head_dim;
  for (int64_t i = 0; i < layers; ++i) {
    const DrafterLayerParams& w = layers_[static_cast<size_t>(i)];
    at::Tensor k =
        nn::ApplyRope(nn::RmsNorm(CastLinear(ctx, w.k_proj, dtype).reshape({rows, hkv, d}),
                                  w.k_norm.to(dtype), c.rms_norm_eps),
                      rope);
    at::Tensor v = CastLinear(ctx, w.v_proj, dtype).reshape({rows, hkv, d});
    int64_t offset = 0;
    for (size_t j = 0; j < blocks.size(); ++j) {
      const int64_t m = counts[j];
      if (m == 0) continue;
      DrafterKvCache* cache = blocks[j].cache;
      cache->k[static_cast<size_t>(i)].narrow(0, cache->rows, m).copy_(k.narrow(0, offset, m));
      cache->v[static_cast<size_t>(i)].narrow(0, cache->rows, m).copy_(v.narrow(0, offset, m));
      offset += m;
    }
  }
  for (size_t j = 0; j < blocks.size(); ++j) blocks[j].cache->rows += counts[j];
}

at::Tensor DrafterModel::RunCachedLayer(int64_t layer, const at::Tensor& x,
                                        const std::vector<CachedBlock>& blocks,
                                        const Prepared& p) const {
  const DrafterLayerParams& w = layers_[static_cast<size_t>(layer)];
  const model::TransformerConfig& c = config_.target;
  const int64_t q_rows = x.size(0), d = c.head_dim;
  const double eps = c.rms_norm_eps;
  const c10::ScalarType dtype = compute_dtype();
  at::Tensor h = nn::RmsNorm(x, w.input_norm.to(dtype), eps);
  at::Tensor attn_delta;  // DFlash2: the attention's output-side kernel offsets
  if (config_.dflash2()) std::tie(h, attn_delta) = ConvIn(h, w.attn_conv_base, w.attn_conv_proj);
  at::Tensor q =
      nn::RmsNorm(CastLinear(h, w.q_proj, dtype).reshape({q_rows, c.num_attention_heads, d}),
                  w.q_norm.to(dtype), eps);
  q = nn::ApplyRope(q, p.q_rope);
  // The block rows' own keys and values, after the context's (Forward's layout).
  at::Tensor k =
      nn::RmsNorm(CastLinear(h, w.k_proj, dtype).reshape({q_rows, c.num_key_value_heads, d}),
                  w.k_norm.to(dtype), eps);
  const size_t l = static_cast<size_t>(layer);
  k = PackedRows(blocks, &DrafterKvCache::k, l, nn::ApplyRope(k, p.q_rope));
  at::Tensor v =
      PackedRows(blocks, &DrafterKvCache::v, l,
                 CastLinear(h, w.v_proj, dtype).reshape({q_rows, c.num_key_value_heads, d}));
  return FinishLayer(layer, x, q, k, v, p, attn_delta);
}

absl::StatusOr<at::Tensor> DrafterModel::ForwardCached(
    const std::vector<CachedBlock>& blocks) const {
  const model::TransformerConfig& c = config_.target;
  const int64_t feature_dim = fc_.size(1);
  if (absl::Status s = CheckBlocks(blocks, config_, feature_dim); !s.ok()) return s;
  try {
    at::NoGradGuard no_grad;
    ExtendCaches(blocks);
    const c10::Device device = options_.device;
    const c10::ScalarType dtype = compute_dtype();
    const int64_t b = config_.block_size, n = static_cast<int64_t>(blocks.size());
    // Forward's packed layout: per sequence its context rows, then the anchor's own row (never a
    // key: a block sees the rows before it), then every block's B rows.
    std::vector<int64_t> doc_ids, anchors, block_positions, lengths, slot0;
    bool short_block = false;
    int64_t row = 0;
    for (int64_t j = 0; j < n; ++j) {
      const CachedBlock& block = blocks[static_cast<size_t>(j)];
      const int64_t rows = block.cache->rows;
      doc_ids.insert(doc_ids.end(), static_cast<size_t>(rows + 1), j);
      anchors.push_back(row + rows);
      row += rows + 1;
      for (int64_t k = 0; k < b; ++k) block_positions.push_back(rows + k);
      slot0.push_back(block.anchor_token);
      lengths.push_back(block.block_length > 0 ? block.block_length : b);
      short_block |= lengths.back() < b;
    }
    const at::TensorOptions long_opts = at::TensorOptions().dtype(at::kLong);
    Prepared p;
    p.t = row;
    p.n = n;
    p.anchors = at::tensor(anchors, long_opts).to(device);
    p.doc_ids = at::tensor(doc_ids, long_opts).to(device);
    p.slot0_tokens = at::tensor(slot0, long_opts);
    p.q_rope =
        nn::MakeRopeTables(at::tensor(block_positions, long_opts).to(device), inv_freq_, dtype);
    p.mask = BuildBlockMask(p.anchors, p.doc_ids, b,
                            short_block ? at::tensor(lengths, long_opts) : at::Tensor());
    at::Tensor x = EmbedBlocks(p).to(dtype);
    for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
      x = RunCachedLayer(i, x, blocks, p);
    }
    return nn::RmsNorm(x, norm_.to(dtype), c.rms_norm_eps);
  } catch (const c10::Error& e) {
    return nn::TorchStatus(e, "drafter forward (cached)");
  }
}

}  // namespace dflash::drafter

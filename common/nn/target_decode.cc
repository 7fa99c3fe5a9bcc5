// TargetModel's generation path: the KV cache and Extend (target_model.h). The packed forward over
// whole documents (Forward) is in target_model.cc.
#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/nn/gated_delta.h"
#include "common/nn/target_model.h"
#include "common/nn/tensor_parallel.h"
#include "common/nn/torch_status.h"
#include "common/nn/weights.h"

namespace dflash::nn {

namespace {

// Where the new rows of S sequences extended by n tokens each go in the [S_all, Hkv, capacity, D]
// caches, and which cached keys each new row may see.
struct BatchedCacheIndex {
  at::Tensor seqs;      // [S] int64: the sequences
  at::Tensor slot_seq;  // [S*n] int64: cache row (sequence) of each new token
  at::Tensor slot_pos;  // [S*n] int64: cache position of each new token
  at::Tensor visible;   // [S, 1, 1, n, Lmax] bool: key j visible to new row i of sequence s
  int64_t n = 0, max_len = 0;
  int64_t first = -1;  // >= 0: the sequences are the cache rows first, first + 1, ... (no gather)
};

BatchedCacheIndex MakeBatchedCacheIndex(const std::vector<int64_t>& sequences, const KvCache& cache,
                                        int64_t n, c10::Device device) {
  BatchedCacheIndex b;
  b.n = n;
  const int64_t s = static_cast<int64_t>(sequences.size());
  std::vector<int64_t> slot_seq, slot_pos, past;
  b.first = sequences.front();
  for (int64_t i = 0; i < s; ++i) {
    const int64_t seq = sequences[i], len = cache.length(seq);
    if (seq != sequences.front() + i) b.first = -1;
    past.push_back(len);
    b.max_len = std::max(b.max_len, len + n);
    for (int64_t j = 0; j < n; ++j) {
      slot_seq.push_back(seq);
      slot_pos.push_back(len + j);
    }
  }
  const at::TensorOptions long_opts = at::TensorOptions().dtype(at::kLong);
  b.seqs = at::tensor(sequences, long_opts).to(device);
  b.slot_seq = at::tensor(slot_seq, long_opts).to(device);
  b.slot_pos = at::tensor(slot_pos, long_opts).to(device);
  // Key j is visible to new row i of sequence s iff j <= past_s + i; built on the device from the
  // S lengths.
  const at::TensorOptions dev_long = long_opts.device(device);
  at::Tensor key = at::arange(b.max_len, dev_long).view({1, 1, b.max_len});
  at::Tensor last = at::tensor(past, long_opts).to(device).view({s, 1, 1}) +
                    at::arange(n, dev_long).view({1, n, 1});
  b.visible = (key <= last).view({s, 1, 1, n, b.max_len});
  return b;
}

// Writes the new keys/values into the caches, then attends every new row to its sequence's
// visible keys: q [S*n, Hq, D] -> [S*n, Hq, D]. Same arithmetic as CachedCausalAttention, with the
// padded keys masked out (their probabilities are exactly zero). The cache is head-major, so each
// (sequence, kv head) is one matrix of the batched products: no copy of the cached keys when the
// sequences are consecutive rows, one gather otherwise.
at::Tensor BatchedCachedAttention(const TargetModel::Qkv& qkv, const BatchedCacheIndex& b,
                                  at::Tensor* k_cache, at::Tensor* v_cache, double scale) {
  // Advanced indices around a full slice: the indexed shape is [S*n, Hkv, D], as qkv.k.
  k_cache->index_put_({b.slot_seq, at::indexing::Slice(), b.slot_pos}, qkv.k);
  v_cache->index_put_({b.slot_seq, at::indexing::Slice(), b.slot_pos}, qkv.v);
  const int64_t s = b.seqs.size(0), n = b.n, hq = qkv.q.size(1), dim = qkv.q.size(2);
  const int64_t hkv = k_cache->size(1), group = hq / hkv;
  auto rows = [&](const at::Tensor& cache) {  // [S*Hkv, L, D]
    at::Tensor c = cache.narrow(2, 0, b.max_len);
    c = b.first >= 0 ? c.narrow(0, b.first, s) : c.index_select(0, b.seqs);
    return c.view({s * hkv, b.max_len, dim});
  };
  at::Tensor q = qkv.q.view({s, n, hkv, group, dim})
                     .permute({0, 2, 3, 1, 4})
                     .reshape({s * hkv, group * n, dim});                      // [S*Hkv, G*n, D]
  at::Tensor scores = at::bmm(q, rows(*k_cache).transpose(1, 2)).mul_(scale);  // [S*Hkv, G*n, L]
  scores.view({s, hkv, group, n, b.max_len})
      .masked_fill_(b.visible.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(qkv.q.scalar_type());
  at::Tensor o = at::bmm(probs, rows(*v_cache));  // [S*Hkv, G*n, D]
  return o.view({s, hkv, group, n, dim}).permute({0, 3, 1, 2, 4}).reshape({s * n, hq, dim});
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const TargetModel& model,
                                                         int64_t sequences, int64_t capacity) {
  if (!model.full()) {
    return absl::FailedPreconditionError(
        "the target model was loaded as a feature extractor (options.full is false): it cannot "
        "generate");
  }
  if (sequences < 1 || capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV cache needs at least one sequence and one "
                     "position, got ",
                     sequences, " x ", capacity));
  }
  const model::TransformerConfig& c = model.config();
  std::unique_ptr<KvCache> cache(new KvCache());
  cache->capacity_ = capacity;
  cache->lengths_.assign(sequences, 0);
  try {
    c10::InferenceMode inference;
    const at::TensorOptions opts = at::TensorOptions().dtype(model.dtype()).device(model.device());
    // A tensor-parallel shard caches its own heads (tensor_parallel.h).
    const int64_t world = model.tp_world();
    const GatedDeltaDims d = ShardDims(GatedDeltaDims::Of(c), world);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (model.linear_layer(l)) {
        cache->k_.emplace_back();
        cache->v_.emplace_back();
        cache->conv_.push_back(at::zeros({sequences, d.conv_kernel - 1, d.conv_dim()}, opts));
        cache->state_.push_back(at::zeros({sequences, d.num_v_heads, d.k_head_dim, d.v_head_dim},
                                          opts.dtype(at::kFloat)));
        continue;
      }
      // Zeros, not garbage: the batched attention multiplies the zero probabilities of padded
      // positions with their values, and 0 * NaN would be NaN.
      cache->k_.push_back(
          at::zeros({sequences, c.num_key_value_heads / world, capacity, c.head_dim}, opts));
      cache->v_.push_back(at::zeros_like(cache->k_.back()));
      cache->conv_.emplace_back();
      cache->state_.emplace_back();
    }
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating a KV cache of ", sequences, " x ",
                                                     capacity,
                                                     " positions: ", e.what_without_backtrace()));
  }
  return cache;
}

absl::Status KvCache::Truncate(int64_t sequence, int64_t length) {
  if (sequence < 0 || sequence >= sequences()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", sequence, " is outside [0, ", sequences(), ")"));
  }
  if (length < 0 || length > lengths_[sequence]) {
    return absl::InvalidArgumentError(absl::StrCat("cannot truncate sequence ", sequence, " of ",
                                                   lengths_[sequence], " positions to ", length));
  }
  if (length != lengths_[sequence]) {
    for (size_t l = 0; l < state_.size(); ++l) {
      if (!state_[l].defined()) continue;
      if (length != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot truncate sequence ", sequence, " of ", lengths_[sequence], " positions to ",
            length, ": a linear-attention layer's recurrent state cannot be rolled back"));
      }
      c10::InferenceMode inference;          // the states are inference tensors (made in Create)
      conv_[l].select(0, sequence).zero_();  // a new sequence starts from empty states
      state_[l].select(0, sequence).zero_();
    }
  }
  lengths_[sequence] = length;
  return absl::OkStatus();
}

bool KvCache::has_recurrent_state() const {
  for (const at::Tensor& s : state_) {
    if (s.defined()) return true;
  }
  return false;
}

void KvCache::SaveStates(const std::vector<int64_t>& sequences) {
  c10::InferenceMode inference;
  saved_rows_.clear();
  for (size_t i = 0; i < sequences.size(); ++i) {
    saved_rows_[sequences[i]] = {static_cast<int64_t>(i), lengths_.at(sequences[i])};
  }
  saved_conv_.assign(conv_.size(), at::Tensor());
  saved_state_.assign(state_.size(), at::Tensor());
  if (sequences.empty()) return;
  const at::Tensor rows = at::tensor(sequences, at::TensorOptions().dtype(at::kLong));
  for (size_t l = 0; l < state_.size(); ++l) {
    if (!state_[l].defined()) continue;
    saved_conv_[l] = conv_[l].index_select(0, rows.to(conv_[l].device()));
    saved_state_[l] = state_[l].index_select(0, rows.to(state_[l].device()));
  }
}

absl::Status KvCache::RestoreStates(int64_t sequence) {
  auto it = saved_rows_.find(sequence);
  if (it == saved_rows_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", sequence, ": no saved recurrent states to go back to"));
  }
  c10::InferenceMode inference;
  const auto [row, length] = it->second;
  for (size_t l = 0; l < state_.size(); ++l) {
    if (!state_[l].defined()) continue;
    conv_[l].select(0, sequence).copy_(saved_conv_[l].select(0, row));
    state_[l].select(0, sequence).copy_(saved_state_[l].select(0, row));
  }
  lengths_[sequence] = length;
  return absl::OkStatus();
}

absl::Status TargetModel::CheckExtend(const std::vector<int64_t>& sequences,
                                      const std::vector<std::vector<int64_t>>& tokens,
                                      const KvCache& cache) const {
  if (!full_) {
    return absl::FailedPreconditionError(
        "the target model was loaded as a feature extractor (options.full is false): it cannot "
        "generate");
  }
  if (sequences.empty() || sequences.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Extend takes one token list per sequence: ", sequences.size(), " sequences, ",
                     tokens.size(), " token lists"));
  }
  if (static_cast<int64_t>(cache.k_.size()) != config_.num_hidden_layers) {
    return absl::InvalidArgumentError("the KV cache was made for another model");
  }
  std::set<int64_t> seen;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t s = sequences[i];
    if (s < 0 || s >= cache.sequences()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " is outside the cache's [0, ", cache.sequences(), ")"));
    }
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " is listed twice"));
    }
    if (tokens[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no new tokens"));
    }
    const int64_t need = cache.length(s) + static_cast<int64_t>(tokens[i].size());
    if (need > cache.capacity()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " would hold ", need,
                                                     " positions, the cache has room for ",
                                                     cache.capacity()));
    }
    for (int64_t id : tokens[i]) {
      if (id < 0 || id >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": token ", id,
                                                       " is outside the vocabulary [0, ",
                                                       config_.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ExtendOutput> TargetModel::Extend(const std::vector<int64_t>& sequences,
                                                 const std::vector<std::vector<int64_t>>& tokens,
                                                 KvCache* cache, bool with_features) const {
  RETURN_IF_ERROR(CheckExtend(sequences, tokens, *cache));
  try {
    c10::InferenceMode inference;
    std::vector<int64_t> ids, positions, offsets = {0};
    for (size_t i = 0; i < sequences.size(); ++i) {
      const int64_t past = cache->length(sequences[i]);
      for (size_t j = 0; j < tokens[i].size(); ++j) {
        ids.push_back(tokens[i][j]);
        positions.push_back(past + static_cast<int64_t>(j));
      }
      offsets.push_back(static_cast<int64_t>(ids.size()));
    }
    const int64_t n = static_cast<int64_t>(ids.size()), h = config_.hidden_size;
    const at::TensorOptions long_opts = at::TensorOptions().dtype(at::kLong);
    RopeTables rope =
        MakeRopeTables(at::tensor(positions, long_opts).to(device_), inv_freq_, dtype_);
    at::Tensor x = at::embedding(embed_tokens_, at::tensor(ids, long_opts).to(device_));  // [N, H]
    ExtendOutput out;
    if (with_features) {
      out.features =
          at::empty({n, feature_dim()}, at::TensorOptions().dtype(dtype_).device(device_));
    }
    const double scale = AttentionScale();
    // Every sequence extended by the same count (decoding steps, verification blocks): one
    // batched attention per layer over the sequences' padded caches instead of one per sequence.
    const int64_t count0 = offsets[1];
    bool uniform = sequences.size() > 1;
    for (size_t i = 1; i < sequences.size() && uniform; ++i) {
      uniform = offsets[i + 1] - offsets[i] == count0;
    }
    BatchedCacheIndex batched;
    if (uniform) batched = MakeBatchedCacheIndex(sequences, *cache, count0, device_);
    // A prefill (every sequence empty): the packed varlen causal attention of Forward (flash on
    // CUDA), so that a long prompt never materializes its n x n scores.
    bool prefill = !uniform || count0 > 1;
    for (int64_t seq : sequences) prefill = prefill && cache->length(seq) == 0;
    std::optional<VarlenDocs> docs;
    if (prefill) {
      std::vector<int32_t> cu(offsets.begin(), offsets.end());
      docs =
          VarlenDocs::FromCuSeqlens(at::tensor(cu, at::TensorOptions().dtype(at::kInt)), device_);
      uniform = false;
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l].linear.defined()) {
        // A linear-attention layer: each sequence continues from its conv rows and state.
        const at::Tensor normed = Norm(x, layers_[l].input_norm);
        const at::Tensor mixed =
            GatedDeltaNetExtend(normed, layers_[l].linear,
                                ShardDims(GatedDeltaDims::Of(config_), tp_world_), sequences,
                                offsets, &cache->conv_[l], &cache->state_[l])
                .contiguous();
        AllReduce(mixed);
        x = Mlp(layers_[l], x + mixed);
        if (with_features && l < slots_of_layer_.size()) {
          for (int64_t slot : slots_of_layer_[l]) out.features.narrow(1, slot * h, h).copy_(x);
        }
        continue;
      }
      Qkv qkv = Project(layers_[l], x, rope);
      if (uniform) {
        at::Tensor attn = BatchedCachedAttention(qkv, batched, &cache->k_[l], &cache->v_[l], scale);
        if (qkv.gate.defined()) attn = attn.reshape({x.size(0), -1}) * qkv.gate.sigmoid();
        x = Finish(layers_[l], x, attn);
        if (with_features && l < slots_of_layer_.size()) {
          for (int64_t slot : slots_of_layer_[l]) out.features.narrow(1, slot * h, h).copy_(x);
        }
        continue;
      }
      at::Tensor attn = prefill ? VarlenCausalAttention(qkv.q, qkv.k, qkv.v, *docs, scale)
                                : at::empty_like(qkv.q);
      for (size_t i = 0; i < sequences.size(); ++i) {
        const int64_t s = sequences[i], past = cache->length(s);
        const int64_t start = offsets[i], count = offsets[i + 1] - start;
        // [Hkv, capacity, D] -> [capacity, Hkv, D] views of this sequence's cache row.
        at::Tensor k_all = cache->k_[l].select(0, s).permute({1, 0, 2});
        at::Tensor v_all = cache->v_[l].select(0, s).permute({1, 0, 2});
        k_all.narrow(0, past, count).copy_(qkv.k.narrow(0, start, count));
        v_all.narrow(0, past, count).copy_(qkv.v.narrow(0, start, count));
        if (prefill) continue;
        attn.narrow(0, start, count)
            .copy_(CachedCausalAttention(qkv.q.narrow(0, start, count),
                                         k_all.narrow(0, 0, past + count),
                                         v_all.narrow(0, 0, past + count), scale));
      }
      if (qkv.gate.defined()) attn = attn.reshape({x.size(0), -1}) * qkv.gate.sigmoid();
      x = Finish(layers_[l], x, attn);
      if (with_features && l < slots_of_layer_.size()) {
        for (int64_t slot : slots_of_layer_[l]) out.features.narrow(1, slot * h, h).copy_(x);
      }
    }
    for (size_t i = 0; i < sequences.size(); ++i) {
      cache->lengths_[sequences[i]] += offsets[i + 1] - offsets[i];
    }
    out.hidden = Norm(x, final_norm_);
    return out;
  } catch (const TensorParallelError& e) {
    return e.status;
  } catch (const c10::Error& e) {
    return TorchStatus(e, "target model extend");
  }
}

absl::StatusOr<at::Tensor> TargetModel::Logits(const at::Tensor& hidden) const {
  if (!full_) {
    return absl::FailedPreconditionError(
        "the target model was loaded as a feature extractor: it has no final norm for logits");
  }
  if (hidden.dim() != 2 || hidden.size(1) != config_.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("hidden must be [N, ", config_.hidden_size,
                                                   "], got ", ShapeString(hidden.sizes().vec())));
  }
  try {
    c10::InferenceMode inference;
    return Linear(hidden.to(lm_head_.scalar_type()), lm_head_).to(at::kFloat);
  } catch (const c10::Error& e) {
    return TorchStatus(e, "target logits");
  }
}

}  // namespace dflash::nn

#include "common/nn/tensor_parallel.h"

#include <ATen/ops/cat.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/nn/target_model.h"

namespace dflash::nn {
namespace {

// t split along `dim` into consecutive blocks of `sizes` (summing to t.size(dim)); of each block
// the rank's 1/world part, concatenated in block order (a new tensor: the whole can be freed).
at::Tensor Shard(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes, int64_t rank,
                 int64_t world) {
  if (!t.defined()) return t;
  std::vector<at::Tensor> parts;
  int64_t begin = 0;
  for (int64_t size : sizes) {
    const int64_t part = size / world;
    parts.push_back(t.narrow(dim, begin + rank * part, part));
    begin += size;
  }
  return at::cat(parts, dim);
}

at::Tensor Whole(const at::Tensor& t, int64_t dim, int64_t rank, int64_t world) {
  return t.defined() ? Shard(t, dim, {t.size(dim)}, rank, world) : t;
}

// A row-parallel layer's bias is added once, after the sum over the group: rank 0 keeps it.
void KeepOnRankZero(at::Tensor& bias, int64_t rank) {
  if (rank != 0) bias = at::Tensor();
}

}  // namespace

GatedDeltaDims ShardDims(const GatedDeltaDims& d, int64_t world) {
  GatedDeltaDims s = d;
  s.num_k_heads = d.num_k_heads / world;
  s.num_v_heads = d.num_v_heads / world;
  return s;
}

void ShardLayer(TargetLayerWeights& w, const model::TransformerConfig& c, int64_t rank,
                int64_t world) {
  if (world == 1) return;
  if (w.linear.defined()) {
    const GatedDeltaDims d = GatedDeltaDims::Of(c);
    const int64_t kd = d.key_dim(), vd = d.value_dim(), hv = d.num_v_heads;
    w.linear.in_proj = Shard(w.linear.in_proj, 0, {kd, kd, vd, vd, hv, hv}, rank, world);
    w.linear.conv = Shard(w.linear.conv, 0, {kd, kd, vd}, rank, world);
    w.linear.dt_bias = Whole(w.linear.dt_bias, 0, rank, world);
    w.linear.a_log = Whole(w.linear.a_log, 0, rank, world);
    w.linear.out_proj = Whole(w.linear.out_proj, 1, rank, world);
  } else {
    const int64_t d = c.head_dim, hq = c.num_attention_heads, hkv = c.num_key_value_heads;
    const int64_t q_rows = (c.attn_output_gate ? 2 : 1) * hq * d;  // per head [query; gate]
    const std::vector<int64_t> blocks = {q_rows, hkv * d, hkv * d};
    w.qkv = Shard(w.qkv, 0, blocks, rank, world);
    w.qkv_bias = Shard(w.qkv_bias, 0, blocks, rank, world);
    w.o_proj = Whole(w.o_proj, 1, rank, world);
    KeepOnRankZero(w.o_bias, rank);
  }
  if (w.moe.defined()) {
    const int64_t mi = w.moe.down.size(2);
    w.moe.gate_up = Shard(w.moe.gate_up, 1, {mi, mi}, rank, world);
    w.moe.down = Whole(w.moe.down, 2, rank, world);
    if (w.moe.shared_gate_up.defined()) {
      const int64_t si = w.moe.shared_down.size(1);
      w.moe.shared_gate_up = Shard(w.moe.shared_gate_up, 0, {si, si}, rank, world);
      w.moe.shared_down = Whole(w.moe.shared_down, 1, rank, world);
    }
  } else {
    const int64_t inter = w.down.size(1);
    w.gate_up = Shard(w.gate_up, 0, {inter, inter}, rank, world);
    w.gate_up_bias = Shard(w.gate_up_bias, 0, {inter, inter}, rank, world);
    w.down = Whole(w.down, 1, rank, world);
    KeepOnRankZero(w.down_bias, rank);
  }
}

}  // namespace dflash::nn

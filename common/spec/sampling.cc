#include "common/spec/sampling.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/scatter.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <mutex>

namespace dflash::spec {

Sampler::Sampler(const SamplingOptions& o, c10::Device device)
    : device_(device), generator_(at::globalContext().defaultGenerator(device).clone()) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_current_seed(o.seed);
}

std::vector<int64_t> Sampler::Sample(const at::Tensor& probs) {
  at::Tensor ids =
      at::multinomial(probs, 1, /*replacement=*/false, generator_).view({-1}).to(at::kCPU);
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
}

at::Tensor Sampler::Uniform(int64_t n) {
  return at::rand({n}, generator_, at::TensorOptions().dtype(at::kFloat).device(device_));
}

std::vector<SampledVerdict> AcceptSampled(const at::Tensor& p, const at::Tensor& q,
                                          const std::vector<SampledBlock>& blocks,
                                          Sampler* sampler) {
  const at::TensorOptions ids = at::TensorOptions().dtype(at::kLong);
  const int64_t v = p.size(1);
  // Every verified proposal of every block: p(x) and q(x) on the device, one uniform each.
  std::vector<int64_t> rows, tokens, q_rows;
  for (const SampledBlock& b : blocks) {
    for (int64_t i = 0; i + 1 < b.length; ++i) {
      rows.push_back(b.first_row + i);
      tokens.push_back((*b.proposals)[i]);
      q_rows.push_back(b.q_index < 0 ? -1 : b.q_index * q.size(1) + i);
    }
  }
  std::vector<uint8_t> keep(rows.size(), 0);
  if (!rows.empty()) {
    const at::Tensor x = at::tensor(tokens, ids).to(p.device()).unsqueeze(1);
    const at::Tensor px = p.index_select(0, at::tensor(rows, ids).to(p.device())).gather(1, x);
    at::Tensor qx = at::ones_like(px);
    if (q.defined()) {
      std::vector<int64_t> clamped = q_rows;
      for (int64_t& r : clamped) r = std::max<int64_t>(r, 0);
      const at::Tensor mask = at::tensor(q_rows, ids).to(p.device()).ge(0).unsqueeze(1);
      const at::Tensor gathered =
          q.reshape({-1, v}).index_select(0, at::tensor(clamped, ids).to(p.device())).gather(1, x);
      qx = at::where(mask, gathered, qx);
    }
    // u < p(x) / q(x), without dividing: kept with probability min(1, p(x) / q(x)).
    const at::Tensor kept =
        (sampler->Uniform(static_cast<int64_t>(rows.size())).unsqueeze(1) * qx < px)
            .view({-1})
            .to(at::kByte)
            .to(at::kCPU);
    std::copy(kept.data_ptr<uint8_t>(), kept.data_ptr<uint8_t>() + kept.numel(), keep.begin());
  }
  std::vector<SampledVerdict> verdicts(blocks.size());
  if (blocks.empty()) return verdicts;
  // Per block, on the host: proposals kept (k), the row of p that draws the next token, and for a
  // rejection the row of q or the proposal to take out of p. Then a fixed number of batched
  // operations for every block at once (no per-block device work: thousands of sequences decode
  // together).
  std::vector<int64_t> next_rows, q_next, rejected_token;
  std::vector<int64_t> bonus, with_q;  // 1 or 0 per block
  size_t first = 0;                    // the block's first entry in `keep`
  for (size_t j = 0; j < blocks.size(); ++j) {
    const SampledBlock& b = blocks[j];
    int64_t k = 0;
    while (k + 1 < b.length && keep[first + k] != 0) ++k;
    first += static_cast<size_t>(std::max<int64_t>(b.length - 1, 0));
    verdicts[j].accepted = k;
    next_rows.push_back(b.first_row + k);
    const bool all_kept = k + 1 >= b.length;
    bonus.push_back(all_kept ? 1 : 0);
    with_q.push_back(!all_kept && b.q_index >= 0 && q.defined() ? 1 : 0);
    q_next.push_back(with_q.back() != 0 ? b.q_index * q.size(1) + k : 0);
    rejected_token.push_back(all_kept ? 0 : (*b.proposals)[k]);
  }
  const auto on_device = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, ids).to(p.device());
  };
  const auto mask = [&](const std::vector<int64_t>& v) { return on_device(v).ne(0).unsqueeze(1); };
  const at::Tensor pk = p.index_select(0, on_device(next_rows));  // [blocks, V]
  // A rejection without q: p without the proposal (q a point mass on it).
  at::Tensor residual = pk.scatter(1, on_device(rejected_token).unsqueeze(1), 0.0);
  if (q.defined()) {
    const at::Tensor qk = q.reshape({-1, v}).index_select(0, on_device(q_next));
    residual = at::where(mask(with_q), (pk - qk).clamp_min(0), residual);
  }
  // Every proposal kept: the bonus token, from p.
  residual = at::where(mask(bonus), pk, residual);
  // A residual with no mass left (p equal to q, where nothing is ever rejected) falls back to p.
  residual = at::where(residual.sum(1).gt(0).unsqueeze(1), residual, pk);
  const std::vector<int64_t> drawn = sampler->Sample(residual);
  for (size_t j = 0; j < blocks.size(); ++j) verdicts[j].next = drawn[j];
  return verdicts;
}

}  // namespace dflash::spec

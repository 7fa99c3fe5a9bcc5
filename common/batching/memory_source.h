// DocumentSource implementations that live in memory, for tests, benchmarks and demos (the real
// one is the memory-mapped prepared data set, common/data/prepared.h).
#pragma once

#include <cstdint>
#include <vector>

#include "common/batching/document_source.h"

namespace dflash::batching {

// Owns every document's tokens and loss mask.
class InMemorySource : public DocumentSource {
 public:
  // `loss_mask` must have as many entries as `tokens`.
  void Add(std::vector<int32_t> tokens, std::vector<uint8_t> loss_mask);

  int64_t num_documents() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t length(int64_t i) const override { return static_cast<int64_t>(tokens_[i].size()); }
  DocumentView document(int64_t i) const override { return {tokens_[i], masks_[i]}; }

 private:
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<std::vector<uint8_t>> masks_;
};

// Document lengths drawn from a log-normal distribution, rounded and clipped to [min_length,
// max_length]: exp(mu + sigma * N(0, 1)) with N from Box-Muller over SplitMix64 (rng.h), so the
// lengths for a seed are the same everywhere (up to libm's last-bit rounding of log/cos).
// mu = ln(1000) - sigma^2 / 2 gives a mean of ~1000 before clipping.
std::vector<int64_t> LogNormalLengths(int64_t n, double mu, double sigma, int64_t min_length,
                                      int64_t max_length, uint64_t seed);

// Documents of given lengths whose tokens are views into one shared pool, so a million documents
// cost a few MB: document i reads pool[s_i, s_i + length) for a per-document start s_i. The loss
// mask alternates prompt (0) and answer (1) runs of 16..271 tokens, like chat data.
class SyntheticSource : public DocumentSource {
 public:
  explicit SyntheticSource(std::vector<int64_t> lengths, uint64_t seed = 0);

  int64_t num_documents() const override { return static_cast<int64_t>(lengths_.size()); }
  int64_t length(int64_t i) const override { return lengths_[i]; }
  DocumentView document(int64_t i) const override;

 private:
  static constexpr int64_t kPoolStarts = int64_t{1} << 20;
  std::vector<int64_t> lengths_;
  std::vector<int32_t> tokens_;  // kPoolStarts + longest document
  std::vector<uint8_t> mask_;
};

}  // namespace dflash::batching

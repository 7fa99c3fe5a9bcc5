#include "common/batching/memory_source.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/base/rng.h"

namespace dflash::batching {

void InMemorySource::Add(std::vector<int32_t> tokens, std::vector<uint8_t> loss_mask) {
  loss_mask.resize(tokens.size(), 0);
  tokens_.push_back(std::move(tokens));
  masks_.push_back(std::move(loss_mask));
}

std::vector<int64_t> LogNormalLengths(int64_t n, double mu, double sigma, int64_t min_length,
                                      int64_t max_length, uint64_t seed) {
  SplitMix64 rng(seed);
  // 53 random bits -> (0, 1]; the +1 keeps log() finite.
  auto uniform = [&rng] { return (static_cast<double>(rng.Next() >> 11) + 1.0) * 0x1.0p-53; };
  std::vector<int64_t> lengths(n);
  for (int64_t i = 0; i < n; ++i) {
    const double normal = std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
    const double x = std::round(std::exp(mu + sigma * normal));
    lengths[i] = std::clamp(static_cast<int64_t>(std::min(x, 1e15)), min_length, max_length);
  }
  return lengths;
}

SyntheticSource::SyntheticSource(std::vector<int64_t> lengths, uint64_t seed)
    : lengths_(std::move(lengths)) {
  const int64_t longest =
      lengths_.empty() ? 0 : *std::max_element(lengths_.begin(), lengths_.end());
  const int64_t pool = kPoolStarts + longest;
  tokens_.resize(pool);
  mask_.resize(pool);
  SplitMix64 rng(seed);
  uint8_t bit = 0;
  int64_t run_left = 0;
  for (int64_t j = 0; j < pool; ++j) {
    const uint64_t r = rng.Next();
    tokens_[j] = static_cast<int32_t>(r % 151000);
    if (run_left == 0) {
      bit ^= 1;
      run_left = 16 + static_cast<int64_t>((r >> 32) & 255);
    }
    mask_[j] = bit;
    --run_left;
  }
}

DocumentView SyntheticSource::document(int64_t i) const {
  const int64_t start = static_cast<int64_t>(Mix64(static_cast<uint64_t>(i)) % kPoolStarts);
  return {absl::Span<const int32_t>(tokens_.data() + start, lengths_[i]),
          absl::Span<const uint8_t>(mask_.data() + start, lengths_[i])};
}

}  // namespace dflash::batching

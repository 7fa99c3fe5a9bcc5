// Shared helpers for the batching tests: random in-memory data sets and random options, all drawn
// from fixed seeds (rng.h), so every run of every test sees the same cases.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/batching/memory_source.h"
#include "common/batching/plan.h"
#include "common/base/rng.h"

namespace dflash::batching::testing {

// The fixed seed list the property tests iterate over.
inline std::vector<uint64_t> PropertySeeds(int count) {
  std::vector<uint64_t> seeds;
  for (int i = 0; i < count; ++i) seeds.push_back(Mix64(0x5eed0000ULL + i));
  return seeds;
}

// n documents with lengths mixing empty, 1-token, short, about max_length and up to 3x
// max_length; tokens encode (document, position) so a misplaced token is visible; the loss mask
// is random runs.
inline std::unique_ptr<InMemorySource> RandomSource(SplitMix64& rng, int64_t n,
                                                    int64_t max_length) {
  auto source = std::make_unique<InMemorySource>();
  for (int64_t d = 0; d < n; ++d) {
    int64_t len;
    switch (rng.Below(8)) {
      case 0:
        len = static_cast<int64_t>(rng.Below(2));
        break;  // empty or one token
      case 1:
        len = max_length + static_cast<int64_t>(rng.Below(2 * max_length + 1));
        break;
      case 2:
        len = max_length - static_cast<int64_t>(rng.Below(std::min<int64_t>(max_length, 3)));
        break;
      default:
        len = 1 + static_cast<int64_t>(rng.Below(std::max<int64_t>(1, max_length / 3)));
    }
    std::vector<int32_t> tokens(len);
    std::vector<uint8_t> mask(len);
    uint8_t bit = static_cast<uint8_t>(rng.Below(2));
    for (int64_t i = 0; i < len; ++i) {
      tokens[i] = static_cast<int32_t>(d * 100003 + i);
      if (rng.Below(5) == 0) bit ^= 1;
      mask[i] = bit;
    }
    source->Add(std::move(tokens), std::move(mask));
  }
  return source;
}

inline BatchingOptions RandomOptions(SplitMix64& rng) {
  static constexpr int64_t kBudgets[] = {16, 64, 100, 257, 1024};
  static constexpr int64_t kWindows[] = {1, 2, 7, 64, 1000};
  BatchingOptions o;
  o.token_budget = kBudgets[rng.Below(5)];
  o.max_length = 1 + static_cast<int64_t>(rng.Below(o.token_budget));
  o.long_documents = rng.Below(2) == 0 ? LongDocuments::kTruncate : LongDocuments::kSplit;
  o.pack_window = kWindows[rng.Below(5)];
  o.num_pairs = 1 + static_cast<int64_t>(rng.Below(8));
  o.grad_accum = 1 + static_cast<int64_t>(rng.Below(4));
  o.seed = rng.Next();
  return o;
}

}  // namespace dflash::batching::testing

#include "common/batching/anchors.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/rng.h"

namespace dflash::batching {

uint64_t AnchorSeed::Hash() const {
  return SeedHash(kTagAnchors, {run_seed, static_cast<uint64_t>(step), uint64_t{0},
                                static_cast<uint64_t>(micro_batch_in_step)});
}

absl::StatusOr<std::vector<int32_t>> SampleAnchors(absl::Span<const uint8_t> loss_mask,
                                                   absl::Span<const int32_t> doc_ids,
                                                   int64_t max_anchors, const AnchorSeed& seed) {
  if (loss_mask.size() != doc_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleAnchors: loss_mask has ", loss_mask.size(), " tokens, doc_ids ", doc_ids.size()));
  }
  if (max_anchors < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleAnchors: max_anchors must be >= 0, got ", max_anchors));
  }
  std::vector<int32_t> valid;
  const int64_t n = static_cast<int64_t>(loss_mask.size());
  for (int64_t a = 0; a + 1 < n; ++a) {
    if (loss_mask[a] != 0 && loss_mask[a + 1] != 0 && doc_ids[a] == doc_ids[a + 1]) {
      valid.push_back(static_cast<int32_t>(a));
    }
  }
  const int64_t k = std::min<int64_t>(max_anchors, static_cast<int64_t>(valid.size()));
  if (k < static_cast<int64_t>(valid.size())) {
    // Partial Fisher-Yates: after step i, valid[0..i] is a uniform sample without replacement.
    SplitMix64 rng(seed.Hash());
    const int64_t m = static_cast<int64_t>(valid.size());
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = i + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(m - i)));
      std::swap(valid[i], valid[j]);
    }
    valid.resize(k);
    std::sort(valid.begin(), valid.end());
  }
  return valid;
}

}  // namespace dflash::batching

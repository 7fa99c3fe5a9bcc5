#include "common/batching/anchors.h"

#include <algorithm>
#include <vector>

#include "common/batching/packed_batch.h"
#include "common/batching/plan.h"
#include "gtest/gtest.h"
#include "tests/batching/batching_test_util.h"

namespace dflash::batching {
namespace {

using testing::PropertySeeds;
using testing::RandomOptions;
using testing::RandomSource;

constexpr int64_t kBlockSize = 16;

std::vector<int32_t> ValidPositions(const PackedBatch& b) {
  std::vector<int32_t> valid;
  for (int64_t a = 0; a + 1 < b.total_tokens; ++a) {
    if (b.loss_mask[a] && b.loss_mask[a + 1] && b.doc_ids[a] == b.doc_ids[a + 1])
      valid.push_back(a);
  }
  return valid;
}

TEST(SampleAnchors, PropertiesOnRandomPackedBatches) {
  for (uint64_t seed : PropertySeeds(400)) {
    SCOPED_TRACE(seed);
    SplitMix64 rng(seed);
    const BatchingOptions o = RandomOptions(rng);
    auto source = RandomSource(rng, 60, o.max_length);
    absl::StatusOr<EpochPlan> plan = PlanEpoch(*source, o, 0);
    ASSERT_TRUE(plan.ok());
    for (int64_t g = 0; g < plan->stats().micro_batches; g += 3) {
      absl::StatusOr<PackedBatch> b =
          MaterializeBatch(*source, plan->GlobalMicroBatch(g), o.token_budget);
      ASSERT_TRUE(b.ok());
      const std::vector<int32_t> valid = ValidPositions(*b);
      const int64_t max_anchors = static_cast<int64_t>(rng.Below(valid.size() + 8));
      const AnchorSeed as{o.seed, static_cast<int64_t>(rng.Below(1000)), g % 3};
      absl::StatusOr<std::vector<int32_t>> anchors =
          SampleAnchors(b->loss_mask, b->doc_ids, max_anchors, as);
      ASSERT_TRUE(anchors.ok());
      ASSERT_EQ(static_cast<int64_t>(anchors->size()),
                std::min<int64_t>(max_anchors, valid.size()));
      ASSERT_TRUE(std::is_sorted(anchors->begin(), anchors->end()));
      ASSERT_EQ(std::adjacent_find(anchors->begin(), anchors->end()), anchors->end());
      for (int32_t a : *anchors) {
        ASSERT_TRUE(std::binary_search(valid.begin(), valid.end(), a));
        const int32_t d = b->doc_ids[a];
        // The first label (a+1) is in the anchor's piece; later block slots that run past the
        // piece's end are exactly those whose doc id differs (or that run past the batch), so the
        // label weight [doc[a+k] == doc[a]] zeroes them.
        ASSERT_LT(a + 1, b->cu_seqlens[d + 1]);
        for (int64_t k = 1; k < kBlockSize && a + k < b->total_tokens; ++k) {
          ASSERT_EQ(b->doc_ids[a + k] == d, a + k < b->cu_seqlens[d + 1]);
        }
      }
      // Same seed, same anchors; all valid ones when the cap allows.
      EXPECT_EQ(*SampleAnchors(b->loss_mask, b->doc_ids, max_anchors, as), *anchors);
      EXPECT_EQ(*SampleAnchors(b->loss_mask, b->doc_ids, valid.size(), as), valid);
    }
  }
}

TEST(SampleAnchors, SeedFieldsEachChangeTheDraw) {
  std::vector<uint8_t> mask(4096, 1);
  std::vector<int32_t> docs(4096, 0);
  const AnchorSeed base{5, 100, 1};
  const std::vector<int32_t> a = *SampleAnchors(mask, docs, 64, base);
  for (AnchorSeed s : {AnchorSeed{6, 100, 1}, AnchorSeed{5, 101, 1}, AnchorSeed{5, 100, 0},
                       AnchorSeed{5, 1, 100}}) {
    EXPECT_NE(*SampleAnchors(mask, docs, 64, s), a);
  }
}

// Without replacement and uniform: over 4000 fixed seeds, each of 100 valid positions is drawn
// 4000 * 10 / 100 = 400 times in expectation (sd ~19); a biased draw (e.g. modulo or a sort-order
// artefact) shows up as counts far outside [300, 500].
TEST(SampleAnchors, UniformOverValidPositions) {
  std::vector<uint8_t> mask(300, 0);
  std::vector<int32_t> docs(300, 0);
  for (int i = 0; i < 101; ++i) mask[100 + i] = 1;  // valid anchors: 100..199
  std::vector<int> count(300, 0);
  for (int64_t step = 0; step < 4000; ++step) {
    const std::vector<int32_t> anchors = *SampleAnchors(mask, docs, 10, AnchorSeed{1, step, 0});
    for (int32_t a : anchors) ++count[a];
  }
  for (int a = 0; a < 300; ++a) {
    if (a >= 100 && a < 200) {
      EXPECT_GT(count[a], 300) << a;
      EXPECT_LT(count[a], 500) << a;
    } else {
      EXPECT_EQ(count[a], 0) << a;
    }
  }
}

TEST(SampleAnchors, DocumentBoundaryAndErrors) {
  // Two documents [0,3) [3,6), all supervised: 2 and 5 are not valid (next token elsewhere / none).
  std::vector<uint8_t> mask(6, 1);
  std::vector<int32_t> docs = {0, 0, 0, 1, 1, 1};
  EXPECT_EQ(*SampleAnchors(mask, docs, 512, AnchorSeed{}), (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_TRUE(SampleAnchors(mask, docs, 0, AnchorSeed{})->empty());
  EXPECT_FALSE(SampleAnchors(mask, std::vector<int32_t>(5, 0), 4, AnchorSeed{}).ok());
  EXPECT_FALSE(SampleAnchors(mask, docs, -1, AnchorSeed{}).ok());
}

TEST(SampleAnchors, GoldenDraw) {
  std::vector<uint8_t> mask(1000, 1);
  std::vector<int32_t> docs(1000, 0);
  EXPECT_EQ(*SampleAnchors(mask, docs, 5, AnchorSeed{42, 7, 3}),
            (std::vector<int32_t>{54, 207, 449, 562, 835}));
}

}  // namespace
}  // namespace dflash::batching

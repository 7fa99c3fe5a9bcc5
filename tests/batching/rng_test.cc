#include "common/base/rng.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace dflash::batching {
namespace {

// Reference outputs of Vigna's splitmix64.c: seed 0, and seed 1234567 (the sequence
// 6457827717110365317, 3203168211198807973, ... published with it).
TEST(SplitMix64, MatchesReferenceImplementation) {
  SplitMix64 zero(0);
  EXPECT_EQ(zero.Next(), 0xe220a8397b1dcdafULL);
  SplitMix64 r(1234567);
  EXPECT_EQ(r.Next(), 6457827717110365317ULL);
  EXPECT_EQ(r.Next(), 3203168211198807973ULL);
}

TEST(SplitMix64, BelowStaysInRangeAndHitsEveryValue) {
  SplitMix64 r(9);
  EXPECT_EQ(r.Below(1), 0u);
  for (uint64_t bound : {2ULL, 3ULL, 7ULL, 1000ULL, (1ULL << 63) + 5}) {
    for (int i = 0; i < 2000; ++i) ASSERT_LT(r.Below(bound), bound);
  }
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) ++hits[r.Below(7)];
  for (int h : hits) {
    EXPECT_GT(h, 850);  // expectation 1000, sd ~30
    EXPECT_LT(h, 1150);
  }
}

// Pins Below and SeedHash: plans and anchors depend on these exact values on every machine.
TEST(SplitMix64, GoldenValues) {
  SplitMix64 r(SeedHash(kTagEpochShuffle, {42, 3}));
  std::vector<uint64_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(r.Below(1000003));
  EXPECT_EQ(got, (std::vector<uint64_t>{367145, 456840, 562211, 955507}));
  EXPECT_EQ(SeedHash(kTagAnchors, {1, 2, 3, 4}), 1312693205059736925ULL);
  EXPECT_NE(SeedHash(0, {1, 2}), SeedHash(0, {2, 1}));
  EXPECT_NE(SeedHash(0, {0}), SeedHash(0, {0, 0}));
}

TEST(DeterministicShuffle, IsAPermutation) {
  std::vector<int> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = i;
  SplitMix64 r(5);
  DeterministicShuffle(v.data(), static_cast<int64_t>(v.size()), r);
  std::vector<int> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  int fixed = 0;
  for (int i = 0; i < 1000; ++i) fixed += v[i] == i;
  EXPECT_LT(fixed, 10);  // a permutation, not the identity (expected ~1 fixed point)
}

}  // namespace
}  // namespace dflash::batching

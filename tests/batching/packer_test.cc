#include "common/batching/packer.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "common/base/rng.h"
#include "gtest/gtest.h"
#include "tests/batching/batching_test_util.h"

namespace dflash::batching {
namespace {

using testing::PropertySeeds;

// CapacityIndex against a std::multimap model over random adds, pops and queries, at budgets that
// span one bitset word, several, and several summary words.
TEST(CapacityIndex, MatchesMultimapModel) {
  for (uint64_t seed : PropertySeeds(40)) {
    SplitMix64 rng(seed);
    static constexpr int64_t kBudgets[] = {1, 63, 64, 65, 4097, 70000};
    const int64_t budget = kBudgets[rng.Below(6)];
    CapacityIndex index(budget);
    std::multimap<int64_t, int32_t> model;
    for (int op = 0; op < 3000; ++op) {
      const int64_t c = static_cast<int64_t>(rng.Below(budget + 1));
      if (rng.Below(3) == 0) {
        index.Add(c, op);
        model.emplace(c, op);
      } else {
        const int64_t found = index.FindAtLeast(c);
        auto it = model.lower_bound(c);
        ASSERT_EQ(found, it == model.end() ? -1 : it->first) << "budget " << budget << " c " << c;
        if (found >= 0 && rng.Below(2) == 0) {
          // Pop returns the latest added with that capacity: the model's last in the equal range.
          auto last = std::prev(model.upper_bound(found));
          ASSERT_EQ(index.Pop(found), last->second);
          model.erase(last);
        }
      }
      if (rng.Below(500) == 0) {
        index.Clear();
        model.clear();
      }
    }
    ASSERT_EQ(index.FindAtLeast(budget + 1), -1);
  }
}

TEST(PackBestFitDecreasing, RespectsBudgetAndPlacesEveryItemOnce) {
  for (uint64_t seed : PropertySeeds(200)) {
    SplitMix64 rng(seed);
    const int64_t budget = 1 + static_cast<int64_t>(rng.Below(3000));
    std::vector<int32_t> lengths(1 + rng.Below(500));
    for (int32_t& l : lengths) l = 1 + static_cast<int32_t>(rng.Below(budget));
    CapacityIndex index(budget);
    std::vector<int32_t> bin_of;
    const int32_t bins = PackBestFitDecreasing(lengths, budget, &index, &bin_of);
    ASSERT_EQ(bin_of.size(), lengths.size());
    std::vector<int64_t> load(bins, 0);
    for (size_t i = 0; i < lengths.size(); ++i) {
      ASSERT_GE(bin_of[i], 0);
      ASSERT_LT(bin_of[i], bins);
      load[bin_of[i]] += lengths[i];
    }
    int64_t total = 0;
    for (int64_t l : load) {
      ASSERT_GT(l, 0);  // no empty bin
      ASSERT_LE(l, budget);
      total += l;
    }
    // Any-fit property: no two bins could have been merged into one (at most one bin half empty).
    int half_empty = 0;
    for (int64_t l : load) half_empty += (2 * l <= budget);
    ASSERT_LE(half_empty, 1);
    ASSERT_EQ(total, std::accumulate(lengths.begin(), lengths.end(), int64_t{0}));
  }
}

TEST(PackBestFitDecreasing, PerfectFitIsFound) {
  // 6+4, 7+3, 5+5 fill three bins of 10 exactly; first-fit in input order would need four.
  std::vector<int32_t> lengths = {6, 7, 5, 3, 5, 4};
  CapacityIndex index(10);
  std::vector<int32_t> bin_of;
  EXPECT_EQ(PackBestFitDecreasing(lengths, 10, &index, &bin_of), 3);
}

}  // namespace
}  // namespace dflash::batching

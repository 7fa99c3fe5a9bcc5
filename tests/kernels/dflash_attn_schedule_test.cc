// Work lists of the fused attention (common/kernels/dflash_attn/schedule.h) against a brute-force
// reading of the mask of method.md §3.3, on random masks: the forward items give every query
// position exactly its visible keys, the backward items visit every visible (key, anchor) pair
// exactly once, nothing invisible, and no key row is in two items (dK, dV are written without
// atomics). Runs on any machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "common/kernels/dflash_attn/schedule.h"

namespace dflash::kernels {
namespace {

struct Mask {
  std::vector<int64_t> doc_ids, anchors, ctx_begin;
};

Mask RandomMask(std::mt19937_64& rng, int64_t n_docs, int64_t n_anchors) {
  Mask m;
  std::vector<int64_t> starts;
  for (int64_t d = 0; d < n_docs; ++d) {
    starts.push_back(static_cast<int64_t>(m.doc_ids.size()));
    m.doc_ids.insert(m.doc_ids.end(), std::uniform_int_distribution<int64_t>(1, 200)(rng), d);
  }
  const int64_t t = static_cast<int64_t>(m.doc_ids.size());
  std::set<int64_t> chosen = {0, t - 1};
  while (static_cast<int64_t>(chosen.size()) < std::min(n_anchors, t)) {
    chosen.insert(std::uniform_int_distribution<int64_t>(0, t - 1)(rng));
  }
  m.anchors.assign(chosen.begin(), chosen.end());
  for (int i = 0; i < 3; ++i) {  // padding anywhere
    const auto at = std::uniform_int_distribution<size_t>(0, m.anchors.size())(rng);
    m.anchors.insert(m.anchors.begin() + static_cast<int64_t>(at), -1);
  }
  for (int64_t a : m.anchors) m.ctx_begin.push_back(a < 0 ? 0 : starts[m.doc_ids[a]]);
  return m;
}

// window 0: full attention; W > 0: a sliding-window layer, where slot k of anchor j sees context
// key c only if c >= a_j + k - W + 1 (the kernels' per-row test, params.h, applied here too).
void CheckSchedule(const Mask& m, int64_t b, int64_t group, int64_t window = 0) {
  const int64_t t = static_cast<int64_t>(m.doc_ids.size()), n = m.anchors.size();
  auto s = BuildDflashSchedule(m.anchors, m.ctx_begin, t, b, group, window);
  ASSERT_TRUE(s.ok()) << s.status();
  const int64_t per_tile = 64 / group;

  // Forward: each query position once, with its anchor's ranges.
  std::vector<int> seen(n * b, 0);
  for (const AttnFwdItem& it : s->fwd) {
    ASSERT_GE(it.n_pos, 1);
    ASSERT_LE(it.n_pos, per_tile);
    const int64_t j = it.q_pos / b;
    ASSERT_EQ((it.q_pos + it.n_pos - 1) / b, j) << "an item spans two anchors";
    for (int p = 0; p < it.n_pos; ++p) ++seen[it.q_pos + p];
    if (m.anchors[j] < 0) {
      EXPECT_EQ(it.kv_end, it.kv_begin);
      EXPECT_LT(it.blk_row, 0);
    } else {
      // The first position's window (the later ones are narrowed per row by the kernel).
      const int64_t lo = window > 0 ? m.anchors[j] + it.q_pos % b - window + 1 : 0;
      EXPECT_EQ(it.kv_begin, std::min(m.anchors[j], std::max(m.ctx_begin[j], lo)));
      EXPECT_EQ(it.kv_end, m.anchors[j]);
      EXPECT_EQ(it.blk_row, t + j * b);
      EXPECT_EQ(it.blk_len, b);
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  for (size_t i = 1; i < s->fwd.size(); ++i) {
    EXPECT_GE(s->fwd[i - 1].kv_end - s->fwd[i - 1].kv_begin, s->fwd[i].kv_end - s->fwd[i].kv_begin)
        << "forward items not heaviest first";
  }

  // Backward: (key, query position) pairs the kernel computes == visible pairs, each once.
  std::map<std::pair<int64_t, int64_t>, int> pairs;
  auto in_window = [&](int64_t key, int64_t j, int64_t slot) {
    return window == 0 || key >= m.anchors[j] + slot - window + 1;
  };
  std::vector<int> key_items(t + n * b, 0);
  for (const AttnBwdItem& it : s->bwd) {
    ASSERT_GE(it.n_keys, 1);
    ASSERT_LE(it.n_keys, 64);
    for (int c = 0; c < it.n_keys; ++c) ++key_items[it.key_row + c];
    for (int64_t j = it.j_begin; j < it.j_end; ++j) {
      if (m.anchors[j] < 0) continue;  // the kernel skips padding anchors
      for (int c = 0; c < it.n_keys; ++c) {
        const int64_t key = it.key_row + c;
        if (it.masked && key >= m.anchors[j]) continue;
        for (int64_t slot = 0; slot < b; ++slot) {
          if (!it.masked || in_window(key, j, slot)) ++pairs[{key, j * b + slot}];
        }
      }
    }
  }
  EXPECT_TRUE(std::all_of(key_items.begin(), key_items.end(), [](int c) { return c <= 1; }))
      << "a key row in two backward items";
  int64_t visible = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t a = m.anchors[j];
    if (a < 0) continue;
    for (int64_t slot = 0; slot < b; ++slot) {
      for (int64_t c = 0; c < t; ++c) {
        if (m.doc_ids[c] == m.doc_ids[a] && c < a && in_window(c, j, slot)) {
          ++visible;
          EXPECT_EQ((pairs[{c, j * b + slot}]), 1)
              << "context key " << c << " anchor " << j << " slot " << slot;
        }
      }
      for (int64_t c = t + j * b; c < t + (j + 1) * b; ++c) {
        ++visible;
        EXPECT_EQ((pairs[{c, j * b + slot}]), 1) << "block key " << c << " anchor " << j;
      }
    }
  }
  int64_t computed = 0;
  for (const auto& [pair, count] : pairs) computed += count;
  EXPECT_EQ(computed, visible) << "backward visits pairs the mask hides";
}

TEST(DflashAttnSchedule, CoversExactlyTheMaskOnRandomBatches) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const Mask m = RandomMask(rng, 1 + round % 7, 5 + round * 7);
    for (const auto& [b, group] :
         {std::pair{16, 4}, std::pair{16, 8}, std::pair{10, 1}, std::pair{8, 64}, std::pair{64, 2},
          std::pair{16, 6}, std::pair{16, 3}}) {
      SCOPED_TRACE(testing::Message() << "round " << round << " B " << b << " G " << group);
      CheckSchedule(m, b, group);
    }
  }
}

TEST(DflashAttnSchedule, ASlidingWindowCoversExactlyItsKeysAndSkipsTheRest) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 12; ++round) {
    const Mask m = RandomMask(rng, 1 + round % 4, 5 + round * 9);
    for (const auto& [b, group, window] :
         {std::tuple{16, 4, 16}, std::tuple{16, 4, 17}, std::tuple{16, 4, 100},
          std::tuple{8, 6, 70}, std::tuple{10, 1, 64}, std::tuple{16, 8, 1000}}) {
      SCOPED_TRACE(testing::Message()
                   << "round " << round << " B " << b << " G " << group << " W " << window);
      CheckSchedule(m, b, group, window);
    }
  }
  // Two anchors 1,000 rows apart in one document, window 64: the backward lists only the keys in
  // the windows (3 + 63 rows), not the 1,000 between.
  auto s = BuildDflashSchedule({3, 1003}, {0, 0}, 1100, 16, 4, 64);
  ASSERT_TRUE(s.ok()) << s.status();
  int64_t context_keys = 0;
  for (const AttnBwdItem& it : s->bwd) context_keys += it.masked ? it.n_keys : 0;
  EXPECT_EQ(context_keys, 3 + 63);
  EXPECT_FALSE(BuildDflashSchedule({4}, {0}, 10, 16, 4, 15).ok()) << "window below the block";
  EXPECT_FALSE(BuildDflashSchedule({4}, {0}, 10, 16, 4, -1).ok()) << "negative window";
}

TEST(DflashAttnSchedule, RefusesBadMasks) {
  EXPECT_FALSE(BuildDflashSchedule({5, 3}, {0, 0}, 10, 16, 4).ok()) << "descending";
  EXPECT_FALSE(BuildDflashSchedule({5, 5}, {0, 0}, 10, 16, 4).ok()) << "repeated";
  EXPECT_FALSE(BuildDflashSchedule({10}, {0}, 10, 16, 4).ok()) << "past the context";
  EXPECT_FALSE(BuildDflashSchedule({4}, {5}, 10, 16, 4).ok()) << "document starts after anchor";
  EXPECT_FALSE(BuildDflashSchedule({4}, {0}, 10, 65, 4).ok()) << "block over 64";
  EXPECT_FALSE(BuildDflashSchedule({4}, {0}, 10, 16, 65).ok()) << "65 heads per kv head";
  EXPECT_FALSE(BuildDflashSchedule({4}, {0}, 10, 16, 0).ok()) << "no heads";
  EXPECT_FALSE(BuildDflashSchedule({4}, {0, 0}, 10, 16, 4).ok()) << "length mismatch";
  EXPECT_TRUE(BuildDflashSchedule({-1, -1}, {0, 0}, 0, 16, 4).ok()) << "all padding";
}

TEST(DflashAttnSchedule, CausalTilesEachPositionOnceWithinItsDocument) {
  const std::vector<int64_t> cu = {0, 5, 5, 70, 200};
  auto items = BuildCausalSchedule(cu, 4);
  ASSERT_TRUE(items.ok()) << items.status();
  std::vector<int> seen(200, 0);
  for (const AttnFwdItem& it : *items) {
    const auto doc = std::upper_bound(cu.begin(), cu.end(), it.q_pos) - cu.begin() - 1;
    EXPECT_EQ(it.kv_begin, cu[doc]);
    EXPECT_EQ(it.kv_end, it.q_pos + it.n_pos);
    EXPECT_LE(it.kv_end, cu[doc + 1]) << "a tile crosses a document end";
    for (int p = 0; p < it.n_pos; ++p) ++seen[it.q_pos + p];
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  EXPECT_FALSE(BuildCausalSchedule({0, 5, 3}, 4).ok());
  EXPECT_FALSE(BuildCausalSchedule({1, 5}, 4).ok());
}

}  // namespace
}  // namespace dflash::kernels

#include "common/kernels/dflash_attn/schedule.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dflash::kernels {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

template <typename Item, typename Cost>
void SortByCost(std::vector<Item>& items, Cost cost) {
  std::stable_sort(items.begin(), items.end(),
                   [&](const Item& x, const Item& y) { return cost(x) > cost(y); });
}

}  // namespace

absl::StatusOr<int> PositionsPerTile(int64_t group) {
  if (group < 1 || group > kAttnTileRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("fused attention: ", group, " query heads per kv head; the kernels take 1 to ",
                     kAttnTileRows));
  }
  return static_cast<int>(kAttnTileRows / group);
}

absl::StatusOr<DflashSchedule> BuildDflashSchedule(const std::vector<int64_t>& anchors,
                                                   const std::vector<int64_t>& ctx_begin,
                                                   int64_t context_rows, int64_t block_size,
                                                   int64_t group, int64_t window) {
  const int64_t n = static_cast<int64_t>(anchors.size());
  if (window < 0 || (window > 0 && window < block_size)) {
    return absl::InvalidArgumentError(absl::StrCat("fused attention: window ", window,
                                                   " (0 for none, or at least the block size ",
                                                   block_size, ")"));
  }
  if (static_cast<int64_t>(ctx_begin.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("fused attention: ", n, " anchors but ", ctx_begin.size(), " ctx_begin"));
  }
  if (block_size < 1 || block_size > kAttnTileKeys) {
    return absl::InvalidArgumentError(absl::StrCat("fused attention: block_size ", block_size,
                                                   " is outside [1, ", kAttnTileKeys, "]"));
  }
  if (context_rows < 0 || context_rows + n * block_size > kInt32Max) {
    return absl::InvalidArgumentError(absl::StrCat("fused attention: ", context_rows, " + ", n,
                                                   " x ", block_size, " rows exceed int32"));
  }
  auto per_tile = PositionsPerTile(group);
  if (!per_tile.ok()) return per_tile.status();
  const int pos_tile = *per_tile;
  int64_t prev = -1;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t a = anchors[j];
    if (a == -1) continue;
    if (a < 0 || a >= context_rows || a <= prev) {
      return absl::InvalidArgumentError(absl::StrCat("fused attention: anchors[", j, "] = ", a,
                                                     " (anchors must be -1 or rows in [0, ",
                                                     context_rows, "), ascending)"));
    }
    if (ctx_begin[j] < 0 || ctx_begin[j] > a) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fused attention: ctx_begin[", j, "] = ", ctx_begin[j], " is not in [0, ", a, "]"));
    }
    prev = a;
  }

  DflashSchedule s;
  const int32_t b = static_cast<int32_t>(block_size);
  const int32_t t = static_cast<int32_t>(context_rows);
  for (int64_t j = 0; j < n; ++j) {
    const bool pad = anchors[j] < 0;
    for (int32_t p0 = 0; p0 < b; p0 += pos_tile) {
      AttnFwdItem it{};
      it.q_pos = static_cast<int32_t>(j) * b + p0;
      it.n_pos = std::min<int32_t>(pos_tile, b - p0);
      // A window narrows the range to the keys the item's first position sees (its later positions
      // see fewer: the kernel masks them per row).
      const int64_t lo = window > 0 ? anchors[j] + p0 - window + 1 : ctx_begin[j];
      it.kv_begin =
          pad ? 0 : static_cast<int32_t>(std::min(anchors[j], std::max(ctx_begin[j], lo)));
      it.kv_end = pad ? 0 : static_cast<int32_t>(anchors[j]);
      it.blk_row = pad ? -1 : t + static_cast<int32_t>(j) * b;
      it.blk_len = pad ? 0 : b;
      s.fwd.push_back(it);
    }
  }
  // Documents: runs of valid anchors with one ctx_begin (padding between them is skipped by the
  // kernel, which reads a_j).
  int64_t j = 0;
  while (j < n) {
    if (anchors[j] < 0) {
      ++j;
      continue;
    }
    const int64_t begin = ctx_begin[j];
    int64_t last = j;  // last valid anchor of the run
    for (int64_t i = j + 1; i < n; ++i) {
      if (anchors[i] < 0) continue;
      if (ctx_begin[i] != begin) break;
      last = i;
    }
    int64_t first = j;  // first anchor of the run with a_j > the tile's first key
    int64_t key = begin;
    while (key < anchors[last]) {
      while (anchors[first] < 0 || anchors[first] <= key) ++first;
      int64_t reach = anchors[last];  // keys [key, reach) are seen by some anchor of the run
      int64_t end = last + 1;         // past the last anchor that sees a key of the tile
      if (window > 0) {
        // Keys before the first anchor's window, and after the windows that overlap it, are seen
        // by no anchor: the tile starts at that window and ends at the first such gap.
        key = std::max(key, anchors[first] - window + 1);
        reach = anchors[first];
        for (int64_t i = first + 1; i <= last && reach < key + kAttnTileKeys; ++i) {
          if (anchors[i] < 0) continue;
          if (anchors[i] - window + 1 > reach) break;
          reach = anchors[i];
        }
      }
      const int64_t n_keys = std::min<int64_t>(kAttnTileKeys, reach - key);
      if (window > 0) {
        end = first + 1;
        for (int64_t i = first + 1; i <= last; ++i) {
          if (anchors[i] < 0) continue;
          if (anchors[i] - window + 1 > key + n_keys - 1) break;
          end = i + 1;
        }
      }
      AttnBwdItem it{};
      it.key_row = static_cast<int32_t>(key);
      it.n_keys = static_cast<int32_t>(n_keys);
      it.j_begin = static_cast<int32_t>(first);
      it.j_end = static_cast<int32_t>(end);
      it.masked = 1;
      s.bwd.push_back(it);
      key += n_keys;
    }
    for (int64_t i = j; i <= last; ++i) {
      if (anchors[i] < 0) continue;
      AttnBwdItem it{};
      it.key_row = t + static_cast<int32_t>(i) * b;
      it.n_keys = b;
      it.j_begin = static_cast<int32_t>(i);
      it.j_end = static_cast<int32_t>(i + 1);
      it.masked = 0;
      s.bwd.push_back(it);
    }
    j = last + 1;
  }
  SortByCost(s.fwd, [](const AttnFwdItem& x) { return int64_t{x.kv_end} - x.kv_begin; });
  SortByCost(s.bwd, [](const AttnBwdItem& x) { return int64_t{x.j_end} - x.j_begin; });
  return s;
}

absl::StatusOr<std::vector<AttnFwdItem>> BuildCausalSchedule(const std::vector<int64_t>& cu_seqlens,
                                                             int64_t group) {
  auto per_tile = PositionsPerTile(group);
  if (!per_tile.ok()) return per_tile.status();
  if (cu_seqlens.empty() || cu_seqlens.front() != 0 || cu_seqlens.back() > kInt32Max) {
    return absl::InvalidArgumentError(
        "fused attention: cu_seqlens must start at 0 and end within int32");
  }
  std::vector<AttnFwdItem> items;
  for (size_t d = 0; d + 1 < cu_seqlens.size(); ++d) {
    const int64_t begin = cu_seqlens[d], end = cu_seqlens[d + 1];
    if (end < begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fused attention: cu_seqlens[", d + 1, "] = ", end, " < cu_seqlens[", d, "] = ", begin));
    }
    for (int64_t p0 = begin; p0 < end; p0 += *per_tile) {
      AttnFwdItem it{};
      it.q_pos = static_cast<int32_t>(p0);
      it.n_pos = static_cast<int32_t>(std::min<int64_t>(*per_tile, end - p0));
      it.kv_begin = static_cast<int32_t>(begin);
      it.kv_end = it.q_pos + it.n_pos;
      it.blk_row = -1;
      it.blk_len = 0;
      items.push_back(it);
    }
  }
  SortByCost(items, [](const AttnFwdItem& x) { return int64_t{x.kv_end} - x.kv_begin; });
  return items;
}

}  // namespace dflash::kernels

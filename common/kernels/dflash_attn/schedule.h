// Work lists of the fused attention kernels (params.h), built on the host from the mask in range
// form. Plain C++ (no CUDA, no LibTorch) so that the coverage rules are unit-tested on any machine.
//
// Drafter (method.md §3.3): anchor j (row a_j, document starting at row c_j) owns query positions
// j*B .. j*B+B-1, which see context keys [c_j, a_j) and block keys T + j*B .. T + j*B + B-1.
//   forward: one item per (anchor, tile of P = 64 / G positions), padding anchors included (they
//            write zeros);
//   backward: per document, context key tiles of 64 from c_j up to the document's last anchor, each
//            with the anchors of that document after the tile's first key; plus one block tile per
//            anchor. Every key row of a kv head is in at most one item, so dK and dV need no
//            atomics.
// A sliding-window layer (window W > 0, at least B): position k of anchor j sees only context keys
// c >= a_j + k - W + 1, so a forward item's range starts at its first position's window and the
// backward's context tiles start at the window of their first anchor and list only the anchors
// whose window reaches them; the kernels mask the rest per row (params.h).
// Target (causal, packed documents): one forward item per tile of P positions of one document.
// Items are sorted by decreasing work (stable), so the longest start first.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kernels/dflash_attn/params.h"

namespace dflash::kernels {

struct DflashSchedule {
  std::vector<AttnFwdItem> fwd;
  std::vector<AttnBwdItem> bwd;
};

// Positions of one CTA tile for `group` query heads per kv head (1..64): 64 / group, so a tile of
// a group that does not divide 64 leaves 64 % group rows empty (6 heads: 10 positions, 60 rows).
absl::StatusOr<int> PositionsPerTile(int64_t group);

// anchors [n]: -1 (padding) or rows in [0, T), strictly ascending among the others; ctx_begin [n]:
// first row of each anchor's document (<= a_j; any value for padding). block_size in [1, 64].
// window: 0 (none) or at least block_size.
absl::StatusOr<DflashSchedule> BuildDflashSchedule(const std::vector<int64_t>& anchors,
                                                   const std::vector<int64_t>& ctx_begin,
                                                   int64_t context_rows, int64_t block_size,
                                                   int64_t group, int64_t window = 0);

// cu_seqlens [docs + 1]: 0 = c_0 <= c_1 <= ... (empty documents allowed).
absl::StatusOr<std::vector<AttnFwdItem>> BuildCausalSchedule(const std::vector<int64_t>& cu_seqlens,
                                                             int64_t group);

}  // namespace dflash::kernels

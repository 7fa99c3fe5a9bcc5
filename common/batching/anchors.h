// Anchor sampling (method.md §3.1): the positions whose blocks the drafter is trained on in one
// packed micro-batch. Drawn by the coordinator from a generator seeded by the run seed and the
// batch's place in the run, so target and drafter agree and a resumed run draws the same anchors.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dflash::batching {

// Where a micro-batch sits in the run. The generator seed is
//   SeedHash(kTagAnchors, {run_seed, step, 0, micro_batch_in_step})   (rng.h)
// with every field cast to uint64_t: no machine- or process-dependent input, so every machine and
// every resume draws the same anchors for the same batch. micro_batch_in_step is the micro-batch's
// place in the step's dealing order over all pairs (index_in_step * num_pairs + pair), not its
// pair: P data-parallel pairs with grad_accum G draw the anchors of one pair with grad_accum P*G.
// (The constant 0 held the pair once; kept so that one-pair runs draw what they always drew.)
struct AnchorSeed {
  uint64_t run_seed = 0;
  int64_t step = 0;                 // optimizer step since the run began
  int64_t micro_batch_in_step = 0;  // 0..num_pairs*grad_accum-1, in dealing order

  uint64_t Hash() const;
  friend bool operator==(const AnchorSeed& a, const AnchorSeed& b) {
    return a.run_seed == b.run_seed && a.step == b.step &&
           a.micro_batch_in_step == b.micro_batch_in_step;
  }
};

// Up to `max_anchors` distinct positions a, sorted ascending, drawn uniformly without replacement
// from the valid ones: loss_mask[a] == 1, loss_mask[a+1] == 1 and doc_ids[a+1] == doc_ids[a]
// (a+1 in the same document). All valid positions when there are at most max_anchors.
// `loss_mask` and `doc_ids` are a PackedBatch's (packed_batch.h); InvalidArgument when their
// lengths differ or max_anchors < 0.
absl::StatusOr<std::vector<int32_t>> SampleAnchors(absl::Span<const uint8_t> loss_mask,
                                                   absl::Span<const int32_t> doc_ids,
                                                   int64_t max_anchors, const AnchorSeed& seed);

}  // namespace dflash::batching

// The coordinator's view of the data: a stream of optimizer steps, each a set of micro-batch
// plans per data-parallel pair, that continues across epochs and can be resumed from a cursor.
//
//   ASSIGN_OR_RETURN(auto batcher, Batcher::Create(&source, options, saved_cursor_or_null));
//   ASSIGN_OR_RETURN(StepPlan step, batcher->NextStep());
//   ... dispatch step.micro_batches, train, then commit step with
//   SerializeCursor(batcher->cursor())
//
// One epoch plan is held at a time (planned when the stream enters the epoch: 0.12-0.21 s per
// million documents, see scripts/bench/packer_bench).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/batching/anchors.h"
#include "common/batching/cursor.h"
#include "common/batching/document_source.h"
#include "common/batching/plan.h"

namespace dflash::batching {

struct MicroBatchPlan {
  int64_t pair = 0;
  int64_t index_in_epoch = 0;  // per-pair micro-batch index within the epoch
  int64_t index_in_step = 0;   // 0..grad_accum-1
  std::vector<Piece> pieces;   // materialize with MaterializeBatch (packed_batch.h)
  AnchorSeed anchor_seed;      // (run seed, step, index_in_step * num_pairs + pair)
};

struct StepPlan {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  int64_t step = 0;                    // optimizer step since the run began (0-based)
  int64_t micro_batches_per_pair = 0;  // grad_accum, or fewer on an epoch's short last step
  // Pair-major: micro_batches[pair * micro_batches_per_pair + index_in_step].
  std::vector<MicroBatchPlan> micro_batches;
};

class Batcher {
 public:
  // `source` must outlive the Batcher. With `resume_from`, the stream continues exactly where the
  // run that wrote it stopped; a cursor from other data or settings, or one pointing outside its
  // epoch, is refused (FailedPrecondition).
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(const DocumentSource* source,
                                                         const BatchingOptions& options,
                                                         const DataCursor* resume_from = nullptr);

  // The next step; advances the cursor (into the next epoch after an epoch's last step).
  absl::StatusOr<StepPlan> NextStep();

  // Position after the last step NextStep returned: commit it together with that step.
  const DataCursor& cursor() const { return cursor_; }
  // The most recently planned epoch: that of the last step returned (or of the cursor, before the
  // first NextStep).
  const EpochPlan& epoch_plan() const { return *plan_; }

 private:
  Batcher(const DocumentSource* source, const BatchingOptions& options, DataCursor cursor)
      : source_(source), options_(options), cursor_(cursor) {}
  absl::Status EnsurePlan();

  const DocumentSource* source_;
  BatchingOptions options_;
  DataCursor cursor_;
  std::optional<EpochPlan> plan_;
};

}  // namespace dflash::batching

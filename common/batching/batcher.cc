#include "common/batching/batcher.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dflash::batching {

absl::StatusOr<std::unique_ptr<Batcher>> Batcher::Create(const DocumentSource* source,
                                                         const BatchingOptions& options,
                                                         const DataCursor* resume_from) {
  RETURN_IF_ERROR(ValidateBatchingOptions(options));
  DataCursor cursor = InitialCursor(options, *source);
  if (resume_from != nullptr) {
    RETURN_IF_ERROR(CheckCursorMatches(*resume_from, cursor));
    cursor = *resume_from;
  }
  std::unique_ptr<Batcher> batcher(new Batcher(source, options, cursor));
  // Plans the cursor's epoch now, so that data too small for the pairs fails at creation.
  RETURN_IF_ERROR(batcher->EnsurePlan());
  const int64_t per_pair = batcher->plan_->micro_batches_per_pair();
  if (cursor.micro_batch >= per_pair || cursor.micro_batch % options.grad_accum != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot resume: the data cursor points at micro-batch ", cursor.micro_batch,
                     " of epoch ", cursor.epoch, ", which has ", per_pair,
                     " micro-batches per pair and starts a step every ", options.grad_accum));
  }
  return batcher;
}

absl::Status Batcher::EnsurePlan() {
  if (plan_.has_value() && plan_->epoch() == cursor_.epoch) return absl::OkStatus();
  plan_.reset();
  ASSIGN_OR_RETURN(EpochPlan plan, PlanEpoch(*source_, options_, cursor_.epoch));
  plan_.emplace(std::move(plan));
  return absl::OkStatus();
}

absl::StatusOr<StepPlan> Batcher::NextStep() {
  RETURN_IF_ERROR(EnsurePlan());
  const EpochPlan& plan = *plan_;
  StepPlan step;
  step.epoch = cursor_.epoch;
  step.step_in_epoch = cursor_.micro_batch / options_.grad_accum;
  step.step = cursor_.step;
  step.micro_batches_per_pair = plan.StepMicroBatches(step.step_in_epoch);
  step.micro_batches.reserve(options_.num_pairs * step.micro_batches_per_pair);
  for (int64_t pair = 0; pair < options_.num_pairs; ++pair) {
    for (int64_t i = 0; i < step.micro_batches_per_pair; ++i) {
      MicroBatchPlan mb;
      mb.pair = pair;
      mb.index_in_epoch = cursor_.micro_batch + i;
      mb.index_in_step = i;
      absl::Span<const Piece> pieces = plan.MicroBatch(pair, mb.index_in_epoch);
      mb.pieces.assign(pieces.begin(), pieces.end());
      mb.anchor_seed = AnchorSeed{options_.seed, step.step, i * options_.num_pairs + pair};
      step.micro_batches.push_back(std::move(mb));
    }
  }
  cursor_.micro_batch += step.micro_batches_per_pair;
  cursor_.step += 1;
  if (cursor_.micro_batch >= plan.micro_batches_per_pair()) {
    cursor_.epoch += 1;
    cursor_.micro_batch = 0;
  }
  return step;
}

}  // namespace dflash::batching

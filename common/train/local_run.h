// One data-parallel pair's training step in one process, target and drafter side by side: the
// batcher plans the step, each micro-batch is materialized, run through the target for its
// features, given anchors (method.md §3.1), and trained on by the DrafterTrainer; checkpoints hold
// the trainer state with the data cursor, so a run resumed from one continues the batch stream,
// the anchors and the loss curve exactly. The target and drafter workers split this same step
// across processes and GPUs (architecture.md); on a CPU machine this is the whole job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/batching/batcher.h"
#include "common/batching/packed_batch.h"
#include "common/drafter/drafter_model.h"
#include "common/nn/target_model.h"
#include "common/train/trainer.h"

namespace dflash::train {

// The drafter's view of a packed micro-batch: its tensors (CPU), anchors as int64 (an empty list
// becomes one padding anchor, -1, so the batch still runs and carries no weight) and the target's
// features [T, K*H].
drafter::DrafterBatch MakeDrafterBatch(const batching::PackedBatch& batch,
                                       const std::vector<int32_t>& anchors,
                                       const at::Tensor& features);

struct LocalRunOptions {
  batching::BatchingOptions batching;  // num_pairs must be 1
  // drafter.init_from: an exported drafter (method.md §7) to start from instead of the random
  // initialization, checked against the run's drafter (drafter_checkpoint.h ImportDrafter). Not
  // applied when resuming: the checkpoint holds the weights.
  std::string init_from;
  int64_t max_anchors = 512;
  drafter::LossOptions loss;
  OptimConfig optim;
  // checkpoint.every_steps / keep: after every `checkpoint_every`-th step and after the last one
  // (optim.total_steps), Step() writes CheckpointPath(checkpoint_dir, step) and keeps the newest
  // `checkpoint_keep` (checkpoints.h). Empty dir or every <= 0: Step() writes none.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int64_t checkpoint_keep = 3;
};

class LocalRun {
 public:
  // `source`, `target` and `drafter` must outlive the run. `resume_from`: a checkpoint written by
  // SaveCheckpoint ("" starts at step 0).
  static absl::StatusOr<std::unique_ptr<LocalRun>> Create(const batching::DocumentSource* source,
                                                          const nn::TargetModel* target,
                                                          drafter::DrafterModel* drafter,
                                                          const LocalRunOptions& options,
                                                          const std::string& resume_from = "");
  // Plans, runs and applies the next optimizer step (and checkpoints, see LocalRunOptions).
  absl::StatusOr<StepStats> Step();
  int64_t step() const { return trainer_->step(); }
  // Trainer state plus the data cursor ("data.cursor" metadata), atomically.
  absl::Status SaveCheckpoint(const std::string& path) const;

 private:
  LocalRun() = default;
  const batching::DocumentSource* source_ = nullptr;
  const nn::TargetModel* target_ = nullptr;
  drafter::DrafterModel* drafter_ = nullptr;
  LocalRunOptions options_;
  std::unique_ptr<DrafterTrainer> trainer_;
  std::unique_ptr<batching::Batcher> batcher_;
  batching::PackedBatch scratch_;
};

}  // namespace dflash::train

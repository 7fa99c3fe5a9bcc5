// The drafter's optimizer step (method.md §3.6 and §4): micro-batches accumulate the loss
// numerator's gradients, the step scales them once by 1 / (the weight sum over the whole step),
// clips the global norm, and applies AdamW (fp32 master weights and state, the model's
// parameters) at the warmup + cosine learning rate. A step whose loss or gradient norm is not
// finite is skipped and counted: the parameters and the optimizer state stay as they were, the
// step counter (and so the schedule) advances.
//
// Data-parallel ranks: with a communicator (transport/communicator.h) of world W > 1, Step()
// sums the loss numerator, the weight sum, the non-finite flag and the slot counts over the ranks,
// then the gradients (fp32, in buckets), in rank order: every rank applies the same update, equal
// to one rank accumulating all the micro-batches (bit for bit on the CPU). A step non-finite on
// any rank is skipped on every rank.
//
// LibTorch is a PRIVATE dependency (see common/drafter/drafter_model.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/drafter/drafter_model.h"
#include "common/transport/communicator.h"

namespace dflash::train {

// After warmup: cosine from lr to 0, linear from lr to 0, or constant lr (run.yaml optim.schedule).
enum class LrSchedule { kCosine, kLinear, kConstant };

struct OptimConfig {
  double lr = 6e-4;  // peak learning rate
  LrSchedule schedule = LrSchedule::kCosine;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double warmup_ratio = 0.04;  // of total_steps, linear from lr / warmup to lr
  double clip_norm = 1.0;      // global gradient norm; <= 0: no clipping
  int64_t total_steps = 1;     // optimizer steps of the run (the cosine reaches 0 at the end)
};

// INVALID_ARGUMENT naming the field.
absl::Status ValidateOptimConfig(const OptimConfig& config);

// Learning rate of optimizer step `step` (0-based): warmup steps w = ceil(warmup_ratio * total)
// rise linearly, lr * (step + 1) / w; then, with progress p = (step - w) / (total - w) in [0, 1),
// cosine lr * (1 + cos(pi p)) / 2, linear lr * (1 - p), or constant lr.
double LearningRate(const OptimConfig& config, int64_t step);

// What one optimizer step did.
struct StepStats {
  int64_t step = 0;       // the step just finished (0-based)
  double loss = 0;        // sum(w * CE) / sum(w) over the step
  double weight_sum = 0;  // sum(w) used to normalize (global when given)
  double grad_norm = 0;   // global norm before clipping (NaN/inf on a skipped step)
  double lr = 0;          // learning rate applied (0 when skipped)
  bool skipped = false;   // not applied: non-finite loss or gradient norm, or no weight
  int64_t micro_batches = 0;
  int64_t oom_splits = 0;  // micro-batches split in two after running out of memory (AddMicroBatch)
  std::vector<int64_t> slot_correct, slot_total;  // [B], summed over the step's micro-batches
  double acceptance_length = 0;                   // drafter::ExpectedAcceptanceLength of those
};

class DrafterTrainer {
 public:
  // `model` must outlive the trainer; its parameters are what the optimizer updates.
  // `comm` (optional, must outlive the trainer): the data-parallel drafters' communicator.
  static absl::StatusOr<std::unique_ptr<DrafterTrainer>> Create(
      drafter::DrafterModel* model, const OptimConfig& config, const drafter::LossOptions& loss,
      transport::Communicator* comm = nullptr);
  ~DrafterTrainer();
  DrafterTrainer(const DrafterTrainer&) = delete;
  DrafterTrainer& operator=(const DrafterTrainer&) = delete;

  // Forward, loss and backward of the numerator for one micro-batch of the current step.
  // `last_in_step` with a communicator: the gradient all-reduce starts bucket by bucket during
  // this backward (grad_reducer.h); otherwise it all runs in Step().
  // Out of device memory: the micro-batch's tensors are freed and its documents are
  // trained as two halves (recursively), which sum to the same step: every token once, the same
  // numerator and weight. A backward that runs out after earlier pieces of the step's first
  // micro-batch were added (without a data-parallel group) starts that micro-batch over in pieces
  // of half the size. Not recoverable, RESOURCE_EXHAUSTED saying why: a single document, or an
  // out-of-memory inside a backward that had begun adding to gradients holding earlier
  // micro-batches of the step (or starting the data-parallel all-reduce).
  absl::Status AddMicroBatch(const drafter::DrafterBatch& batch, bool last_in_step = false);
  // Test hook (CPU tests of the recovery): a micro-batch of more than `rows` rows fails as if its
  // forward ran out of memory. 0 turns it off.
  void InjectOutOfMemoryAbove(int64_t rows) { inject_oom_above_ = rows; }
  // Test hook (CPU tests): a micro-batch of more than `rows` rows fails as if its backward ran out
  // of memory after adding its gradients. 0 turns it off.
  void InjectBackwardOutOfMemoryAbove(int64_t rows) { inject_backward_oom_above_ = rows; }
  // Ends the step (a collective when there is a communicator: every rank calls it). StepStats
  // then hold the sums over all ranks. `global_weight_sum` overrides the weight sum the gradients
  // are divided by (tests; without a communicator only).
  absl::StatusOr<StepStats> Step(std::optional<double> global_weight_sum = std::nullopt);

  int64_t step() const { return step_; }              // steps finished
  int64_t skipped_steps() const { return skipped_; }  // of those, not applied
  const OptimConfig& config() const { return config_; }
  const drafter::LossOptions& loss() const { return loss_; }

  // Everything a resumed run needs from the trainer, as named fp32/int64 CPU tensors and metadata:
  // "param/<name>", "adam.exp_avg/<name>", "adam.exp_avg_sq/<name>", "adam.step/<name>", and
  // metadata "trainer.step", "trainer.skipped". Written atomically by SaveState (safetensors).
  absl::Status SaveState(const std::string& path,
                         const std::map<std::string, std::string>& extra_metadata) const;
  // Restores parameters, optimizer state and counters saved by SaveState for the same drafter
  // shape; refuses (naming the tensor) a missing or mis-shaped entry before changing anything.
  // Returns the file's metadata (extra entries included).
  absl::StatusOr<std::map<std::string, std::string>> LoadState(const std::string& path);

 private:
  struct Impl;
  DrafterTrainer(drafter::DrafterModel* model, OptimConfig config, drafter::LossOptions loss);
  absl::Status ReduceScalars();  // numerator, weight sum, non-finite flag, slot counts
  absl::Status ApplyOptimizer(StepStats* stats);  // norm, clipping, AdamW; sets lr, grad_norm
  absl::Status ReduceGradients();  // every parameter's gradient (the GradReducer's buckets)
  // One attempt at AddMicroBatch; *in_backward tells whether a failure came from the backward.
  absl::Status TryMicroBatch(const drafter::DrafterBatch& batch, bool last_in_step,
                             bool* in_backward);
  // AddMicroBatch's pieces: `batch` split `depth` times by documents (fewer where a piece is one
  // document), each piece tried and halved further when it runs out of memory. *restart: a
  // backward ran out after earlier pieces were added, and `restartable` (AddMicroBatch starts
  // over with depth + 1).
  absl::Status AddPieces(const drafter::DrafterBatch& batch, bool last_in_step, int depth,
                         bool restartable, bool* restart);
  int64_t inject_oom_above_ = 0, inject_backward_oom_above_ = 0;
  drafter::DrafterModel* model_;
  OptimConfig config_;
  drafter::LossOptions loss_;
  transport::Communicator* comm_ = nullptr;
  std::unique_ptr<Impl> impl_;
  int64_t step_ = 0, skipped_ = 0;
};

}  // namespace dflash::train

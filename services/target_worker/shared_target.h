// The target worker's loaded targets, one copy per checkpoint: a run's training steps
// (target_runner.cc) and the evaluator's decoding (evaluator.cc: `dflashctl eval`, `regen`,
// evaluations during training) take their model from this process-wide cache, which loads a
// target once per (target.path, target.dtype, device) and hands the same weights to every user
// it can serve:
//   - decoding needs a full model (every layer and the final norm); any full copy of the
//     checkpoint serves it, whatever its feature layers;
//   - training needs the run's feature layers; a copy with the same layer ids serves it, full or
//     not (a full model's Forward still stops at the last feature layer); a run that evaluates
//     (eval.every_steps) needs both.
// A model lives as long as a user holds it, plus the one model the evaluator last decoded with,
// kept idle so that the next call (regen's many Generate calls) does not load it again. A request
// the live models cannot serve first drops that idle model (freed unless a user still holds it),
// then loads. So after regen, training on the same target reuses regen's copy instead of loading
// a second one. docs/memory.md ("One copy of the target") says what the memory plan counts.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/nn/target_model.h"
#include "common/transport/communicator.h"

namespace dflash::worker {

// A tensor-parallel shard's all-reduce over `comm` (TargetModelOptions.tp_all_reduce): the tensor's
// dtype and device as the communicator's reduce type and memory.
std::function<absl::Status(const at::Tensor&)> SumOver(transport::Communicator* comm);

// What a cached shard sums with until a user binds its group: a FAILED_PRECONDITION.
std::function<absl::Status(const at::Tensor&)> NoGroupYet();

class TargetCache {
 public:
  using Loader = std::function<absl::StatusOr<std::unique_ptr<nn::TargetModel>>()>;

  // The process's cache (the evaluator and every run of the worker share it).
  static TargetCache& Process();

  struct Need {
    bool full = false;      // every layer and the final norm (to decode)
    bool features = false;  // the spec's feature layers (`auto` resolved from the target's config)
    // A tensor-parallel shard (placement.target_parallel): rank `tp_rank` of `tp_world`. A cached
    // shard sums through no group of its own: each user binds its group with
    // TargetModel::WithAllReduce (training steps and decoding each have theirs).
    int64_t tp_rank = 0, tp_world = 1;
  };
  // A model of `spec`'s target on `device` that has what `need` asks. A live model that serves
  // the request is returned; otherwise the idle model is dropped and `loader` loads a new one (one
  // load at a time).
  absl::StatusOr<std::shared_ptr<nn::TargetModel>> Acquire(const config::RunSpec& spec,
                                                           c10::Device device, Need need,
                                                           const Loader& loader);
  // Keeps `model` alive while no one uses it, replacing the model kept before (the evaluator's).
  void KeepIdle(std::shared_ptr<nn::TargetModel> model);
  // Drops the idle model (freed unless a user still holds it).
  void DropIdle();

  int64_t loads() const;        // models loaded so far (by `loader`)
  int64_t live_models() const;  // models alive now (held by a user or kept idle)

 private:
  struct Entry {
    std::string key;  // path | dtype | device
    std::weak_ptr<nn::TargetModel> model;
  };

  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::shared_ptr<nn::TargetModel> idle_;
  int64_t loads_ = 0;
};

}  // namespace dflash::worker

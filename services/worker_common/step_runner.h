// The role-specific half of a worker: what it loads for a run and what one training step does.
// Plain C++ structs only (no protobuf, no LibTorch), because the implementations include LibTorch
// headers, which must not meet generated protobuf headers in one translation unit; WorkerCore
// converts the RPC messages to these.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/batching/plan.h"
#include "common/config/run_spec.h"

namespace dflash::worker {

// Everything PrepareRun tells a worker about the run it is to hold.
struct RunContext {
  std::string run_id;
  config::RunSpec spec;
  int gpu = -1;  // this worker's device, -1 for the CPU
  int64_t pair = 0, num_pairs = 1;
  int64_t total_steps = 1;
  std::string resume_checkpoint;   // drafter: trainer state to continue from ("" = fresh)
  std::string channel;             // the pair's feature channel name
  std::string transport = "host";  // resolved by the coordinator: host | cuda_ipc | nccl
  // Drafters, num_pairs > 1: the data-parallel group (PrepareRunRequest fields of these names).
  std::string drafter_group, collective;
  std::string nccl_unique_id;  // bytes
  // Drafters, transport nccl: the target's NcclChannel descriptor (bytes).
  std::string channel_descriptor;
  // Targets, placement.target_parallel > 1: the tensor-parallel group (PrepareRunRequest fields).
  int64_t tp_rank = 0, tp_world = 1;
  std::string tp_group, tp_collective;
  std::string tp_nccl_unique_id;  // bytes
};

// What Prepare hands back: the applied settings and, from the pair-0 drafter of an nccl group,
// the communicator's unique id for the other drafters.
struct Prepared {
  std::map<std::string, std::string> applied;
  std::string nccl_unique_id;
  std::string channel_descriptor;  // a target on transport nccl: for its drafter
  std::string tp_nccl_unique_id;   // rank 0 of an nccl tensor-parallel target group
  // The kernels this worker runs where it has a choice ("attention: fused kernels in every
  // layer"; "" = nothing to report): in the run's start event beside the applied settings.
  std::string kernels;
};

struct StepMicroBatch {
  uint64_t batch_id = 0;
  std::vector<batching::Piece> pieces;  // target: what to pack
  std::vector<int32_t> anchors;         // drafter: anchor positions in the packed batch
};

struct StepWork {
  int64_t step = 0, epoch = 0;
  std::vector<StepMicroBatch> micro_batches;
  std::string checkpoint_path;  // drafter: save the trainer state after the step ("" = no)
  std::map<std::string, std::string> checkpoint_metadata;
  std::string export_dir;  // drafter: export the serving format after the step ("" = no)
};

struct StepReport {
  int64_t step = 0, micro_batches = 0, tokens = 0;
  uint32_t checksum = 0;  // CRC-32 chained over the step's feature messages (both sides agree)
  // The feature channel: bytes of features and messages moved (cuda_ipc: the features stay in
  // place and count once, on the target side) and seconds blocked in Send / Receive.
  int64_t transport_bytes = 0;
  double transport_wait_seconds = 0;
  int64_t max_queue_depth = 0;  // batches in the channel: target after each send, drafter at each
                                // receive (before consuming), the most seen in the step
  // Drafter only:
  double loss = 0, weight_sum = 0, grad_norm = 0, lr = 0;
  bool skipped = false;
  int64_t skipped_steps = 0;
  int64_t oom_splits = 0;  // drafter: micro-batches split after an out-of-memory this step
  std::vector<double> slot_accuracy;
  double acceptance_length = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Loads the models and data the role needs and opens the feature channel; returns the settings
  // it applies ("field.path" -> value) for the coordinator's settings check.
  virtual absl::StatusOr<Prepared> Prepare(const RunContext& ctx) = 0;
  virtual absl::StatusOr<StepReport> RunStep(const StepWork& work) = 0;
  // Unblocks a RunStep waiting on the channel (it returns ABORTED); called from another thread.
  virtual void Abort() = 0;
};

using StepRunnerFactory = std::function<std::unique_ptr<StepRunner>()>;

}  // namespace dflash::worker

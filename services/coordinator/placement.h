// Where a run's workers are, and what that allows: the feature transport of a pair, the
// collective of its data-parallel drafters, and whether those drafters can form their group.
// Pure functions of the registered workers' info (control address and device).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/transport/transport.h"
#include "dflash/v1/common.pb.h"

namespace dflash::coordinator {

using WorkerPairs = std::vector<std::pair<v1::WorkerInfo, v1::WorkerInfo>>;  // (target, drafter)

// A queued run placed on workers: what starting it needs.
struct Placement {
  std::string run_id;
  std::string resolved_yaml;
  WorkerPairs pairs;
  // placement.target_parallel > 1: pair i's other target processes (tensor-parallel ranks
  // 1..n-1; rank 0 is pairs[i].first, the one the drafter's channel connects to).
  std::vector<std::vector<v1::WorkerInfo>> target_ranks;
  // eval.worker (docs/run-spec.md): a target group reserved for the run's evaluations (rank 0
  // first), or empty (pair 0's target decodes them).
  std::vector<v1::WorkerInfo> eval_group;
};

// Whether a run takes a target group of its own for its evaluations: kNo, kIfIdle (eval.worker
// auto with a tensor-parallel target on GPUs: reserved when one more idle group is there), kYes
// (eval.worker reserved: the run waits for one).
enum class EvalGroupNeed { kNo, kIfIdle, kYes };
EvalGroupNeed EvalGroupWanted(const config::RunSpec& spec,
                              const std::vector<std::vector<v1::WorkerInfo>>& groups);

// The host part of a control address ("10.0.0.1:7001" -> "10.0.0.1").
std::string HostOf(const std::string& address);

// One device of one machine: "<host>/<kind><index>", e.g. "10.0.0.1/cuda0" or "10.0.0.1/cpu-1".
std::string DeviceKey(const v1::WorkerInfo& worker);

// How data-parallel drafters sum gradients: through shared memory when they run on the CPU (the
// drafter processes of one machine), NCCL when they hold GPUs.
transport::Collective DrafterCollective(const v1::WorkerInfo& drafter);

// Data-parallel drafters must be able to form their group: all of one kind; CPU drafters
// (shared memory) on one machine; GPU drafters (NCCL) each on its own GPU, since NCCL refuses
// two ranks on one device. FAILED_PRECONDITION naming placement.pairs and the workers otherwise.
absl::Status CheckDrafterGroup(const WorkerPairs& pairs);

// placement.transport for one pair. auto: cuda_ipc when the target and drafter hold the same GPU
// of one machine, nccl when they hold two different GPUs (of one machine or of two), host
// otherwise (a CPU worker: features through shared memory on one machine). The choice, explicit or
// resolved, is checked against the pair: cuda_ipc needs one GPU, nccl two (NCCL refuses two ranks
// on one device), host one machine; FAILED_PRECONDITION naming placement.transport and the workers.
absl::StatusOr<transport::Transport> ResolveTransport(const config::RunSpec& spec,
                                                      const v1::WorkerInfo& target,
                                                      const v1::WorkerInfo& drafter);

// Tensor-parallel target groups (placement.target_parallel = n) from idle target workers, in their
// order: each group is n workers of one machine and one kind (CPU: a shared-memory group; GPU: n
// different GPUs, one NCCL rank each). Workers that complete no group are left out. n = 1: every
// worker alone.
std::vector<std::vector<v1::WorkerInfo>> GroupTargets(const std::vector<v1::WorkerInfo>& targets,
                                                      int64_t n);

// How a tensor-parallel target group sums its partial layer outputs: `host` for CPU targets, `nccl`
// for GPU targets.
transport::Collective TargetCollective(const v1::WorkerInfo& target);

// What a run's memory plan is checked against before it is placed: for each role the registered
// worker with the largest GPU (capacity 0 and no name when the role has no GPU worker), and the
// transport a pair of them would use (placement.transport, or what auto resolves to: cuda_ipc when
// a target and a drafter share a GPU, nccl when both roles have GPUs, host otherwise).
struct PlanTargets {
  int64_t target_capacity = 0, drafter_capacity = 0;
  std::string target_worker, drafter_worker;
  transport::Transport transport = transport::Transport::kHost;
  int64_t shared_capacity = 0;  // the largest GPU a target and a drafter share (0: none)
  std::string shared_gpu;       // e.g. "GPU 0 of t0"
};
PlanTargets PlanTargetsOf(const config::RunSpec& spec, const std::vector<v1::WorkerInfo>& workers);

// What one worker of a placement needs on its GPU (the memory plan's device total).
struct DeviceNeed {
  v1::WorkerInfo worker;
  int64_t bytes = 0;
};

// One GPU's memory now (the latest heartbeats) against what the workers placed on it need.
struct GpuMemoryNow {
  std::string host;
  int64_t index = 0;
  std::vector<std::string> workers;  // the placed workers' names, in the order of the needs
  int64_t need = 0;                  // their plans together
  uint64_t total = 0;
  uint64_t free = 0;         // the lowest free figure those workers reported
  uint64_t placed_own = 0;   // what the placed workers' LibTorch allocators hold (theirs to reuse)
  uint64_t all_workers = 0;  // what every registered worker that is up holds on this GPU
  uint64_t others = 0;       // total - free - all_workers: held by other processes
  bool known = true;         // false: a worker never reported its free memory (not checked)
  bool Fits() const { return !known || need <= static_cast<int64_t>(free + placed_own); }
  // "GPU 0 of host 10.0.0.1: 41.0 GiB free, the pair needs 46.0 GiB; held by other processes:
  // 97.8 GiB" ("the worker" when one worker is placed there).
  std::string Describe() const;
};

// The placement's needs grouped by GPU (DeviceKey), in the order the GPUs first appear; CPU
// workers are left out. `registered`: every registered worker (whose allocators do not count as
// other processes).
std::vector<GpuMemoryNow> MemoryNow(const std::vector<DeviceNeed>& needs,
                                    const std::vector<v1::WorkerInfo>& registered);

// Why the run must wait: the first GPU of MemoryNow without room for its workers (its free
// memory plus what those workers' allocators hold, which they free or reuse), Describe()d;
// "" when every GPU has room.
std::string FreeMemoryShortfall(const std::vector<DeviceNeed>& needs,
                                const std::vector<v1::WorkerInfo>& registered);

}  // namespace dflash::coordinator

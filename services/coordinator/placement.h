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
#include "dflash/v1/common.pb.h"

namespace dflash::coordinator {

using WorkerPairs = std::vector<std::pair<v1::WorkerInfo, v1::WorkerInfo>>;  // (target, drafter)

// The host part of a control address ("10.0.0.1:7001" -> "10.0.0.1").
std::string HostOf(const std::string& address);

// One device of one machine: "<host>/<kind><index>", e.g. "10.0.0.1/cuda0" or "10.0.0.1/cpu-1".
std::string DeviceKey(const v1::WorkerInfo& worker);

// How data-parallel drafters sum gradients: through shared memory when they run on the CPU (the
// drafter processes of one machine), NCCL when they hold GPUs.
std::string Collective(const v1::WorkerInfo& drafter);

// Data-parallel drafters must be able to form their group: all of one kind; CPU drafters
// (shared memory) on one machine; GPU drafters (NCCL) each on its own GPU, since NCCL refuses
// two ranks on one device. FAILED_PRECONDITION naming placement.pairs and the workers otherwise.
absl::Status CheckDrafterGroup(const WorkerPairs& pairs);

// placement.transport for one pair. auto: cuda_ipc when the target and drafter hold the same GPU
// of one machine, nccl when they hold two different GPUs (of one machine or of two), host
// otherwise (a CPU worker: features through shared memory on one machine). The choice, explicit or
// resolved, is checked against the pair: cuda_ipc needs one GPU, nccl two (NCCL refuses two ranks
// on one device), host one machine; FAILED_PRECONDITION naming placement.transport and the workers.
absl::StatusOr<std::string> ResolveTransport(const config::RunSpec& spec,
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
std::string TargetCollective(const v1::WorkerInfo& target);

// What a run's memory plan is checked against before it is placed: for each role the registered
// worker with the largest GPU (capacity 0 and no name when the role has no GPU worker), and the
// transport a pair of them would use (placement.transport, or what auto resolves to: cuda_ipc when
// a target and a drafter share a GPU, nccl when both roles have GPUs, host otherwise).
struct PlanTargets {
  int64_t target_capacity = 0, drafter_capacity = 0;
  std::string target_worker, drafter_worker;
  std::string transport;
  int64_t shared_capacity = 0;  // the largest GPU a target and a drafter share (0: none)
  std::string shared_gpu;       // e.g. "GPU 0 of t0"
};
PlanTargets PlanTargetsOf(const config::RunSpec& spec, const std::vector<v1::WorkerInfo>& workers);

}  // namespace dflash::coordinator

// The memory planner (architecture.md, "Memory: planned, measured, enforced"): each
// worker's peak GPU memory predicted from the model configs and the run's budgets, as named terms,
// before anything is loaded. Plain arithmetic, no LibTorch: the coordinator runs it at submit and
// at placement, `dflashctl plan` prints it.
//
// What is predicted is the LibTorch caching allocator's peak of allocated bytes (what the workers
// export as dflash_worker_gpu_memory_peak_bytes and what the H200 validation in
// docs/benchmarks.md compares against), as the largest of a few phases of the worker's life, each
// a sum of terms; then what the device needs beyond it: transport buffers allocated outside the
// allocator, the allocator's slack (reserved beyond allocated) and the CUDA context. The terms
// follow the code (docs/memory.md has the formulas and where each comes from).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/model/hf_config.h"
#include "common/model/mask_token.h"
#include "common/run/resolve.h"
#include "common/transport/transport.h"

namespace dflash::plan {

struct Term {
  std::string name;  // e.g. "weights", "activations"
  std::string what;  // how it is made up, e.g. "bf16, 34 of 36 layers + embed_tokens + lm_head"
  int64_t bytes = 0;
};

// One moment of the worker's life and the terms alive then (indices into WorkerPlan::terms).
struct Phase {
  std::string name;  // e.g. "loading the target", "end of the forward"
  std::vector<size_t> terms;
  int64_t bytes = 0;
};

struct WorkerPlan {
  std::string role;         // "target" | "drafter"
  std::vector<Term> terms;  // allocator terms
  std::vector<Phase> phases;
  size_t peak_phase = 0;
  int64_t allocator_peak = 0;  // the largest phase
  // Outside the allocator's peak: transport buffers (cudaMalloc), slack, CUDA context.
  std::vector<Term> extra;
  int64_t device_bytes = 0;  // allocator_peak + extra: what the GPU must hold
  // The largest term of the peak phase that a setting changes (activations, features, ...), or
  // of the peak phase overall when none does.
  size_t dominant_term = 0;
};

struct RunPlan {
  int64_t token_budget = 0, max_anchors = 0;
  transport::Transport transport = transport::Transport::kCudaIpc;
  WorkerPlan target, drafter;
};

// The plan for one target/drafter pair on GPUs with features moving by `transport` (its buffers:
// transport::BuffersOf). The run spec must be validated.
absl::StatusOr<RunPlan> PlanRun(const config::RunSpec& spec, const model::TransformerConfig& target,
                                transport::Transport transport);

// Whether each worker fits a GPU of `capacity_bytes` (0: unknown, not checked). Not fitting:
// FAILED_PRECONDITION naming the worker, its predicted need, the dominant term, and the setting
// that would make it fit (e.g. "batching.max_anchors 1024 -> 640"), found by planning again with
// smaller values of the setting the dominant term depends on.
absl::Status CheckFits(const config::RunSpec& spec, const model::TransformerConfig& target,
                       transport::Transport transport, const std::string& role,
                       const std::string& worker, int64_t capacity_bytes);

// A target and a drafter on one GPU (cuda_ipc): their device totals together against it, with
// the same refusal as CheckFits (the dominant term is the larger worker's).
absl::Status CheckSharedGpuFits(const config::RunSpec& spec, const model::TransformerConfig& target,
                                const std::string& gpu, int64_t capacity_bytes);

// The plan as a table (GiB, one block per worker, `capacities` in bytes per role: 0 = unknown)
// and as JSON (bytes).
std::string PlanTable(const RunPlan& plan, int64_t target_capacity, int64_t drafter_capacity);
std::string PlanJson(const RunPlan& plan, int64_t target_capacity, int64_t drafter_capacity);

}  // namespace dflash::plan

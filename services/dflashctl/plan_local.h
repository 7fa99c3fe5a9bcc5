// `dflashctl plan --local`: the memory plan of a run.yaml on this machine, without a coordinator
// (docs/cli.md, "plan"): the same planner (common/plan/memory_plan.h) against a GPU size given on
// the command line instead of the registered workers' GPUs.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace dflash::ctl {

struct LocalPlanArgs {
  std::string run_yaml;  // path; validated and resolved as submit does (paths checked here)
  double gpu_gib = 0;    // each GPU's memory in GiB; 0: not checked
  // Where the pair's two workers run: "one_gpu" (a target and a drafter sharing a GPU: their
  // totals together against it, `auto` -> cuda_ipc) or "two_gpus" (`auto` -> nccl).
  std::string layout = "one_gpu";
  bool json = false;
  // Also the largest batching.token_budget (max_anchors scaled with it) whose plan fits --gpu_gib:
  // per worker with two_gpus, for the pair with one_gpu (plan::LargestTokenBudget).
  bool largest = false;
};

// Prints the plan (table or JSON) on `out` and problems on `err`; returns an ExitCode: kOk,
// kInvalidConfig (the run.yaml or the target's config refused), kDoesNotFit (a worker, or the
// pair on one GPU, above --gpu_gib), kUsage (a bad layout, --largest without --gpu_gib).
int PlanLocal(const LocalPlanArgs& args, std::ostream& out, std::ostream& err);

}  // namespace dflash::ctl

#include "services/dflashctl/plan_local.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/config/run_spec.h"
#include "common/plan/largest_budget.h"
#include "common/plan/memory_plan.h"
#include "common/run/resolve.h"
#include "common/transport/transport.h"
#include "nlohmann/json.hpp"
#include "services/dflashctl/commands.h"

namespace dflash::ctl {
namespace {

// The transport a pair at `layout` would use: placement.transport, or what `auto` picks there.
transport::Transport PlannedTransport(const config::RunSpec& spec, bool one_gpu) {
  transport::PairLocation where;
  where.same_host = true;
  where.both_gpus = true;
  where.same_gpu = one_gpu;
  // Validated with the run.yaml (config::TransportChoices).
  return transport::ChosenTransport(spec.placement.transport, where)
      .value_or(transport::AutoTransport(where));
}

}  // namespace

int PlanLocal(const LocalPlanArgs& args, std::ostream& out, std::ostream& err) {
  if (args.layout != "one_gpu" && args.layout != "two_gpus") {
    err << "dflashctl: plan: --layout must be one_gpu or two_gpus, got \"" << args.layout << "\"\n";
    return kUsage;
  }
  if (args.gpu_gib < 0) {
    err << "dflashctl: plan: --gpu_gib must be >= 0, got " << args.gpu_gib << "\n";
    return kUsage;
  }
  if (args.largest && args.gpu_gib <= 0) {
    err << "dflashctl: plan: --largest needs --gpu_gib (the GPU the batches must fit)\n";
    return kUsage;
  }
  std::optional<config::RunSpec> spec = ParseLocally(args.run_yaml, err);
  if (!spec) return kInvalidConfig;
  absl::StatusOr<model::TransformerConfig> target = run::RunTargetConfig(*spec);
  if (!target.ok()) {
    err << "dflashctl: plan: " << target.status().message() << "\n";
    return kInvalidConfig;
  }
  // What submit refuses against the target before planning (the plan would be of a run that
  // cannot start).
  if (absl::Status s = run::CheckRunTargetShapes(*spec, *target); !s.ok()) {
    err << "dflashctl: plan: " << s.message() << "\n";
    return kInvalidConfig;
  }
  const bool one_gpu = args.layout == "one_gpu";
  const transport::Transport tr = PlannedTransport(*spec, one_gpu);
  absl::StatusOr<plan::RunPlan> p = plan::PlanRun(*spec, *target, tr);
  if (!p.ok()) {
    err << "dflashctl: plan: " << p.status().message() << "\n";
    return kInvalidConfig;
  }
  const int64_t capacity = static_cast<int64_t>(args.gpu_gib * (1ull << 30));
  const std::string gpu = absl::StrCat("(--gpu_gib ", args.gpu_gib, ")");
  std::vector<std::string> problems;
  for (const char* role : {"target", "drafter"}) {
    absl::Status fits = plan::CheckFits(*spec, *target, tr, role, gpu, capacity);
    if (!fits.ok()) problems.emplace_back(fits.message());
  }
  // Sharing one GPU, the two workers' totals together (whatever carries the features).
  if (one_gpu && problems.empty()) {
    absl::Status fits = plan::CheckSharedGpuFits(*spec, *target, "one GPU " + gpu, capacity);
    if (!fits.ok()) problems.emplace_back(fits.message());
  }
  // --largest: the pair on one GPU, or each worker on its own.
  std::vector<plan::FittedBudget> largest;
  if (args.largest) {
    if (one_gpu) {
      largest = {{"target and drafter on one GPU", plan::FitScope::kSharedGpu, capacity}};
    } else {
      largest = {{"target worker", plan::FitScope::kTarget, capacity},
                 {"drafter worker", plan::FitScope::kDrafter, capacity}};
    }
    if (absl::Status s = plan::FillLargestBudgets(*spec, *target, tr, &largest); !s.ok()) {
      err << "dflashctl: plan: --largest: " << s.message() << "\n";
      return kInvalidConfig;
    }
  }
  if (args.json) {
    nlohmann::json j = nlohmann::json::parse(plan::PlanJson(*p, capacity, capacity));
    j["local"] = {{"layout", args.layout}, {"gpu_bytes", capacity}};
    j["problems"] = problems;
    if (args.largest) j["largest"] = nlohmann::json::parse(plan::LargestJson(largest));
    out << j.dump(2) << "\n";
  } else {
    out << "# planned here (--local): "
        << (one_gpu ? "the target and the drafter on one GPU"
                    : "the target and the drafter on two GPUs")
        << (capacity > 0 ? "" : "; no --gpu_gib: not checked against a GPU") << "\n"
        << plan::PlanTable(*p, capacity, capacity);
    if (args.largest) out << plan::LargestTable(largest, *spec);
  }
  for (const std::string& problem : problems) err << "dflashctl: does not fit: " << problem << "\n";
  out.flush();
  return problems.empty() ? kOk : kDoesNotFit;
}

}  // namespace dflash::ctl

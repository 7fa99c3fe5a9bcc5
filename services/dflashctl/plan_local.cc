#include "services/dflashctl/plan_local.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

struct Fitted {
  std::string who;  // "target worker", "drafter worker", "target and drafter on one GPU"
  plan::LargestBudget largest;
};

// The largest budgets of --largest: the pair on one GPU, or each worker on its own.
absl::StatusOr<std::vector<Fitted>> LargestBudgets(const config::RunSpec& spec,
                                                   const model::TransformerConfig& target,
                                                   transport::Transport tr, bool one_gpu,
                                                   int64_t capacity) {
  std::vector<std::pair<std::string, plan::FitScope>> scopes;
  if (one_gpu) {
    scopes = {{"target and drafter on one GPU", plan::FitScope::kSharedGpu}};
  } else {
    scopes = {{"target worker", plan::FitScope::kTarget},
              {"drafter worker", plan::FitScope::kDrafter}};
  }
  std::vector<Fitted> out;
  for (const auto& [who, scope] : scopes) {
    absl::StatusOr<plan::LargestBudget> l =
        plan::LargestTokenBudget(spec, target, tr, scope, capacity);
    if (!l.ok()) return l.status();
    out.push_back({who, *l});
  }
  return out;
}

std::string LargestText(const std::vector<Fitted>& fitted, const config::RunSpec& spec,
                        double gpu_gib) {
  std::string out =
      absl::StrCat("largest batches that fit --gpu_gib ", gpu_gib,
                   " (batching.max_anchors scaled with the budget: ", spec.batching.max_anchors,
                   " per ", spec.batching.token_budget, " tokens):\n");
  for (const Fitted& f : fitted) {
    const plan::LargestBudget& l = f.largest;
    if (l.token_budget == 0) {
      absl::StrAppend(&out, "  ", f.who, ": none (not even batching.token_budget ",
                      std::max<int64_t>(spec.data.max_length, 256), ", data.max_length's floor)\n");
      continue;
    }
    absl::StrAppend(&out, "  ", f.who, ": batching.token_budget ", l.token_budget, ", max_anchors ",
                    l.max_anchors, " (",
                    absl::StrFormat("%.2f", static_cast<double>(l.device_bytes) / (1ull << 30)),
                    " GiB)", l.at_field_maximum ? ", the field's maximum" : "", "\n");
  }
  if (fitted.size() > 1) {  // a run takes the smaller of its workers' budgets
    const auto smaller = std::min_element(fitted.begin(), fitted.end(), [](auto& a, auto& b) {
      return a.largest.token_budget < b.largest.token_budget;
    });
    absl::StrAppend(&out, "  the pair: batching.token_budget ", smaller->largest.token_budget,
                    " (the ", smaller->who, "'s)\n");
  }
  return out;
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
  std::vector<Fitted> largest;
  if (args.largest) {
    absl::StatusOr<std::vector<Fitted>> l = LargestBudgets(*spec, *target, tr, one_gpu, capacity);
    if (!l.ok()) {
      err << "dflashctl: plan: --largest: " << l.status().message() << "\n";
      return kInvalidConfig;
    }
    largest = *std::move(l);
  }
  if (args.json) {
    nlohmann::json j = nlohmann::json::parse(plan::PlanJson(*p, capacity, capacity));
    j["local"] = {{"layout", args.layout}, {"gpu_bytes", capacity}};
    j["problems"] = problems;
    if (args.largest) {
      nlohmann::json list = nlohmann::json::array();
      for (const Fitted& f : largest) {
        list.push_back({{"who", f.who},
                        {"token_budget", f.largest.token_budget},
                        {"max_anchors", f.largest.max_anchors},
                        {"device_bytes", f.largest.device_bytes},
                        {"at_field_maximum", f.largest.at_field_maximum}});
      }
      j["largest"] = list;
    }
    out << j.dump(2) << "\n";
  } else {
    out << "# planned here (--local): "
        << (one_gpu ? "the target and the drafter on one GPU"
                    : "the target and the drafter on two GPUs")
        << (capacity > 0 ? "" : "; no --gpu_gib: not checked against a GPU") << "\n"
        << plan::PlanTable(*p, capacity, capacity);
    if (args.largest) out << LargestText(largest, *spec, args.gpu_gib);
  }
  for (const std::string& problem : problems) err << "dflashctl: does not fit: " << problem << "\n";
  out.flush();
  return problems.empty() ? kOk : kDoesNotFit;
}

}  // namespace dflash::ctl

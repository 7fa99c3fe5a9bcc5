#include "common/plan/largest_budget.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/plan/memory_plan.h"
#include "nlohmann/json.hpp"

namespace dflash::plan {
namespace {

// The spec at `budget` tokens, its anchors at the run's ratio.
config::RunSpec AtBudget(const config::RunSpec& spec, int64_t budget) {
  config::RunSpec s = spec;
  s.batching.token_budget = budget;
  s.batching.max_anchors = std::clamp<int64_t>(
      spec.batching.max_anchors * budget / spec.batching.token_budget, 1, kMaxAnchors);
  return s;
}

absl::StatusOr<int64_t> Need(const config::RunSpec& spec, const model::TransformerConfig& target,
                             transport::Transport transport, FitScope scope) {
  absl::StatusOr<RunPlan> p = PlanRun(spec, target, transport);
  if (!p.ok()) return p.status();
  switch (scope) {
    case FitScope::kTarget:
      return p->target.device_bytes;
    case FitScope::kDrafter:
      return p->drafter.device_bytes;
    case FitScope::kSharedGpu:
      return p->target.device_bytes + p->drafter.device_bytes;
  }
  return absl::InternalError("unknown fit scope");
}

}  // namespace

int64_t SmallestBudgetTried(const config::RunSpec& spec) {
  const int64_t floor = std::max<int64_t>(spec.data.max_length, 256);
  return (floor + kBudgetStep - 1) / kBudgetStep * kBudgetStep;
}

absl::StatusOr<LargestBudget> LargestTokenBudget(const config::RunSpec& spec,
                                                 const model::TransformerConfig& target,
                                                 transport::Transport transport, FitScope scope,
                                                 int64_t capacity_bytes) {
  if (capacity_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the largest budget needs a GPU size, got ", capacity_bytes, " bytes"));
  }
  if (spec.batching.token_budget <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching.token_budget must be > 0, got ", spec.batching.token_budget));
  }
  // In steps of kBudgetStep: lo fits, everything above hi does not (or is past the maximum).
  int64_t lo = SmallestBudgetTried(spec) / kBudgetStep;
  int64_t hi = kMaxTokenBudget / kBudgetStep;
  const auto need_at = [&](int64_t steps) {
    return Need(AtBudget(spec, steps * kBudgetStep), target, transport, scope);
  };
  absl::StatusOr<int64_t> need = need_at(lo);
  if (!need.ok()) return need.status();
  if (*need > capacity_bytes) return LargestBudget{};
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    absl::StatusOr<int64_t> n = need_at(mid);
    if (!n.ok()) return n.status();
    if (*n <= capacity_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const config::RunSpec at = AtBudget(spec, lo * kBudgetStep);
  need = need_at(lo);
  if (!need.ok()) return need.status();
  return LargestBudget{at.batching.token_budget, at.batching.max_anchors, *need,
                       at.batching.token_budget == kMaxTokenBudget};
}

absl::Status FillLargestBudgets(const config::RunSpec& spec, const model::TransformerConfig& target,
                                transport::Transport transport, std::vector<FittedBudget>* lines) {
  for (FittedBudget& line : *lines) {
    absl::StatusOr<LargestBudget> l =
        LargestTokenBudget(spec, target, transport, line.scope, line.capacity_bytes);
    if (!l.ok()) return l.status();
    line.largest = *l;
  }
  return absl::OkStatus();
}

std::string LargestTable(const std::vector<FittedBudget>& lines, const config::RunSpec& spec) {
  const auto gib = [](int64_t b) {
    return absl::StrFormat("%.2f", static_cast<double>(b) / (int64_t{1} << 30));
  };
  std::string out =
      absl::StrCat("largest batches that fit (batching.max_anchors scaled with the budget: ",
                   spec.batching.max_anchors, " per ", spec.batching.token_budget, " tokens):\n");
  for (const FittedBudget& f : lines) {
    const LargestBudget& l = f.largest;
    absl::StrAppend(&out, "  ", f.who, ", ", gib(f.capacity_bytes), " GiB: ");
    if (l.token_budget == 0) {
      absl::StrAppend(&out, "none (not even batching.token_budget ", SmallestBudgetTried(spec),
                      ", data.max_length's floor)\n");
      continue;
    }
    absl::StrAppend(&out, "batching.token_budget ", l.token_budget, ", max_anchors ", l.max_anchors,
                    " (", gib(l.device_bytes), " GiB)",
                    l.at_field_maximum ? ", the field's maximum" : "", "\n");
  }
  if (lines.size() > 1) {  // a run takes one budget for both workers
    const auto smallest =
        std::min_element(lines.begin(), lines.end(), [](const auto& a, const auto& b) {
          return a.largest.token_budget < b.largest.token_budget;
        });
    absl::StrAppend(&out, "  the pair: batching.token_budget ", smallest->largest.token_budget,
                    " (the ", smallest->who, "'s)\n");
  }
  return out;
}

std::string LargestJson(const std::vector<FittedBudget>& lines) {
  nlohmann::json list = nlohmann::json::array();
  for (const FittedBudget& f : lines) {
    list.push_back({{"who", f.who},
                    {"capacity_bytes", f.capacity_bytes},
                    {"token_budget", f.largest.token_budget},
                    {"max_anchors", f.largest.max_anchors},
                    {"device_bytes", f.largest.device_bytes},
                    {"at_field_maximum", f.largest.at_field_maximum}});
  }
  return list.dump();
}

}  // namespace dflash::plan

#include "common/plan/largest_budget.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/plan/memory_plan.h"

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
  const int64_t smallest = std::max<int64_t>(spec.data.max_length, 256);
  int64_t lo = (smallest + kBudgetStep - 1) / kBudgetStep;
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

}  // namespace dflash::plan

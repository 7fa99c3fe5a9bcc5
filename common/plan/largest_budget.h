// The largest batch a GPU takes, by the memory planner (docs/memory.md, "The largest batch that
// fits"): `dflashctl plan --local --largest` and the planner's tests ask it. Plain arithmetic, as
// memory_plan.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/model/hf_config.h"
#include "common/transport/transport.h"

namespace dflash::plan {

// What must fit: one worker alone on its GPU, or a target and a drafter sharing one (their device
// totals together, as CheckSharedGpuFits).
enum class FitScope { kTarget, kDrafter, kSharedGpu };

struct LargestBudget {
  int64_t token_budget = 0;  // 0: not even the smallest budget tried fits
  int64_t max_anchors = 0;   // at that budget (the run's anchors per token)
  int64_t device_bytes = 0;  // what the scope needs at that budget
  // The field's maximum (kMaxTokenBudget) fits: a larger GPU would take no larger budget.
  bool at_field_maximum = false;
};

// batching.token_budget's largest allowed value (config's range).
inline constexpr int64_t kMaxTokenBudget = int64_t{1} << 20;
// batching.max_anchors' largest allowed value: the scaled anchors stop there.
inline constexpr int64_t kMaxAnchors = 65536;
// The budgets tried are multiples of this.
inline constexpr int64_t kBudgetStep = 512;

// The smallest budget LargestTokenBudget tries: data.max_length (validation's floor for
// batching.token_budget, at least 256) rounded up to a multiple of kBudgetStep.
int64_t SmallestBudgetTried(const config::RunSpec& spec);

// The largest batching.token_budget, a multiple of kBudgetStep from data.max_length (the smallest
// budget validation allows) up to kMaxTokenBudget, whose plan fits `capacity_bytes` for `scope`;
// batching.max_anchors scales with it at the run's ratio (max_anchors * budget / token_budget,
// from 1 to kMaxAnchors), every other setting as `spec` has it. The planner's needs grow with the
// budget, so the search halves the range. `spec` must be validated; `capacity_bytes` > 0.
absl::StatusOr<LargestBudget> LargestTokenBudget(const config::RunSpec& spec,
                                                 const model::TransformerConfig& target,
                                                 transport::Transport transport, FitScope scope,
                                                 int64_t capacity_bytes);

// One line of a "largest batches" answer: what must fit (a worker, or the pair sharing one GPU),
// the GPU's bytes it must fit, and the largest budget that does.
struct FittedBudget {
  std::string who;  // e.g. "drafter worker", "target and drafter on one GPU"
  FitScope scope = FitScope::kDrafter;
  int64_t capacity_bytes = 0;
  LargestBudget largest;
};

// Fills each line's `largest` (LargestTokenBudget of its scope and capacity).
absl::Status FillLargestBudgets(const config::RunSpec& spec, const model::TransformerConfig& target,
                                transport::Transport transport, std::vector<FittedBudget>* lines);

// The lines as text (a header, a line each, and with several lines "the pair": the smallest
// budget, which a run takes for both workers) and as a JSON array (bytes), for `dflashctl plan
// --largest` with and without --local.
std::string LargestTable(const std::vector<FittedBudget>& lines, const config::RunSpec& spec);
std::string LargestJson(const std::vector<FittedBudget>& lines);

}  // namespace dflash::plan

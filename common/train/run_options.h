// run.yaml (config::RunSpec) -> the options of one pair's training (local_run.h), every field
// mapped, nothing silently ignored: a setting this code cannot honour is refused by name.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/train/local_run.h"

namespace dflash::train {

// `total_steps`: the run's optimizer steps (optim.max_steps, or derived from optim.epochs and the
// data by the caller); `num_pairs`: data-parallel pairs. INVALID_ARGUMENT naming the field.
// checkpoint_dir stays empty: it is the caller's (the run's directory).
absl::StatusOr<LocalRunOptions> LocalRunOptionsFor(const config::RunSpec& spec, int64_t total_steps,
                                                   int64_t num_pairs = 1);

}  // namespace dflash::train

// A run's checkpoint files: <dir>/step-<step, 12 digits>.safetensors, each written atomically
// (temporary file + rename, see DrafterTrainer::SaveState), the newest `keep` kept.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace dflash::train {

std::string CheckpointPath(const std::string& dir, int64_t step);

// The checkpoint with the highest step not above `max_step` in `dir` (nullopt when there is none,
// or no `dir`). Temporary and foreign files are ignored.
absl::StatusOr<std::optional<std::string>> LatestCheckpoint(
    const std::string& dir, int64_t max_step = std::numeric_limits<int64_t>::max());

// Removes all checkpoints of `dir` but the `keep` newest (keep >= 1).
absl::Status PruneCheckpoints(const std::string& dir, int64_t keep);

}  // namespace dflash::train

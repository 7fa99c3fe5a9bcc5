// A run's held-out evaluation snapshots under <run_dir>/eval/: the drafter of each evaluated step
// (step-<12 digits>/, the serving format), of which the newest and the best (highest tau) are
// kept; <run_dir>/eval/best.json names the best one, for `dflashctl export --best`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dflash::train {

// One evaluation: the step whose drafter was evaluated, its held-out tau and the directory that
// holds that drafter (a snapshot under eval/, or the run's export/ for the last step).
struct EvalSnapshot {
  int64_t step = 0;
  double tau = 0.0;
  std::string dir;
};

// The best evaluation recorded in <run_dir>/eval/best.json (nullopt before the first); an
// unreadable or malformed file is an error naming it.
absl::StatusOr<std::optional<EvalSnapshot>> ReadBestEval(const std::string& run_dir);

// Records `e` as the best when no best is recorded or its tau is higher (a tie keeps the earlier
// step, the cheaper drafter to have reached it); best.json is replaced atomically. Returns the
// best after the update.
absl::StatusOr<EvalSnapshot> RecordEval(const std::string& run_dir, const EvalSnapshot& e);

// Removes every snapshot directory under <run_dir>/eval/ that is not one of `keep`.
void PruneEvalSnapshots(const std::string& run_dir, const std::vector<std::string>& keep);

}  // namespace dflash::train

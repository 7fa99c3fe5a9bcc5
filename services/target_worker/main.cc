// dflash-target-worker: runs the target model and produces the drafter's context features.
// See services/target_worker/README.md.
#include "absl/strings/str_join.h"
#include "services/worker_common/worker_main.h"

namespace {

// The settings a target worker applies from the resolved run config (settings echo).
std::map<std::string, std::string> TargetSettings(const dflash::config::RunSpec& s) {
  return {
      {"target.path", s.target.path},
      {"target.dtype", s.target.dtype},
      {"target.layer_ids", s.target.layer_ids ? absl::StrJoin(*s.target.layer_ids, ",") : "auto"},
      {"batching.token_budget", std::to_string(s.batching.token_budget)},
      {"data.max_length", std::to_string(s.data.max_length)},
      {"placement.transport", s.placement.transport},
  };
}

}  // namespace

int main(int argc, char** argv) {
  return dflash::worker::RunWorkerMain(argc, argv, dflash::v1::WORKER_ROLE_TARGET, TargetSettings);
}

// dflash-drafter-worker: trains the DFlash drafter on features from its paired target worker.
// See services/drafter_worker/README.md.
#include "absl/strings/str_cat.h"
#include "services/worker_common/worker_main.h"

namespace {

// The settings a drafter worker applies from the resolved run config (settings echo).
std::map<std::string, std::string> DrafterSettings(const dflash::config::RunSpec& s) {
  return {
      {"drafter.layers", std::to_string(s.drafter.layers)},
      {"drafter.block_size", std::to_string(s.drafter.block_size)},
      {"drafter.mask_token_id",
       s.drafter.mask_token_id ? std::to_string(*s.drafter.mask_token_id) : "auto"},
      {"batching.token_budget", std::to_string(s.batching.token_budget)},
      {"batching.max_anchors", std::to_string(s.batching.max_anchors)},
      {"batching.grad_accum", std::to_string(s.batching.grad_accum)},
      {"loss.gamma", s.loss.gamma ? absl::StrCat(*s.loss.gamma) : "auto"},
      {"optim.lr", absl::StrCat(s.optim.lr)},
      {"placement.transport", s.placement.transport},
  };
}

}  // namespace

int main(int argc, char** argv) {
  return dflash::worker::RunWorkerMain(argc, argv, dflash::v1::WORKER_ROLE_DRAFTER,
                                       DrafterSettings);
}

// dflash-target-worker: runs the target model and produces the drafter's context features.
// See services/target_worker/README.md.
#include "services/target_worker/target_runner.h"
#include "services/worker_common/evaluator.h"
#include "services/worker_common/worker_main.h"

int main(int argc, char** argv) {
  return dflash::worker::RunWorkerMain(argc, argv, dflash::v1::WORKER_ROLE_TARGET,
                                       dflash::worker::NewTargetRunner,
                                       dflash::worker::NewTargetEvaluator);
}

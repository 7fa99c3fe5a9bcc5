// dflash-drafter-worker: trains the DFlash drafter on features from its paired target worker.
// See services/drafter_worker/README.md.
#include "services/drafter_worker/drafter_runner.h"
#include "services/worker_common/worker_main.h"

int main(int argc, char** argv) {
  return dflash::worker::RunWorkerMain(argc, argv, dflash::v1::WORKER_ROLE_DRAFTER,
                                       dflash::worker::NewDrafterRunner);
}

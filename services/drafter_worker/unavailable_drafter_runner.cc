// The drafter worker built without LibTorch: registers and refuses runs
// (services/worker_common/unavailable_runner.h).
#include "services/drafter_worker/drafter_runner.h"
#include "services/worker_common/unavailable_runner.h"

namespace dflash::worker {

std::unique_ptr<StepRunner> NewDrafterRunner() { return NewUnavailableRunner(); }

}  // namespace dflash::worker

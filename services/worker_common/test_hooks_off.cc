// The product binaries' test hooks: none (test_hooks.h).
#include "services/worker_common/test_hooks.h"

namespace dflash::worker {

WorkerTestHooks ReadWorkerTestHooks() { return {}; }

}  // namespace dflash::worker

// The test executables' hooks, read from the environment (test_hooks.h). Linked only into
// dflash-{target,drafter}-worker-testhooks.
#include <cstdlib>

#include "services/worker_common/test_hooks.h"

namespace dflash::worker {
namespace {

int64_t ReadInt(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? -1 : std::atoll(v);
}

}  // namespace

WorkerTestHooks ReadWorkerTestHooks() {
  WorkerTestHooks h;
  h.corrupt_features_message = ReadInt("DFLASH_TEST_CORRUPT_FEATURES_MESSAGE");
  h.oom_above_tokens = ReadInt("DFLASH_TEST_OOM_ABOVE_TOKENS");
  return h;
}

}  // namespace dflash::worker

// Fault injection for the integration tests, kept out of the product binaries. The step runners
// ask ReadWorkerTestHooks() when a run starts. The product executables (dflash-target-worker,
// dflash-drafter-worker) link test_hooks_off.cc, which injects nothing; the test executables
// dflash-target-worker-testhooks and dflash-drafter-worker-testhooks link test_hooks_env.cc, which
// reads DFLASH_TEST_CORRUPT_FEATURES_MESSAGE and DFLASH_TEST_OOM_ABOVE_TOKENS. A test
// (worker_binaries_carry_no_test_hooks) checks that the product binaries hold neither name.
#pragma once

#include <cstdint>

namespace dflash::worker {

struct WorkerTestHooks {
  // Target: flip one bit of the Nth feature message's features (0-based) after its checksum was
  // taken, as a corrupting transport would. -1 = off.
  int64_t corrupt_features_message = -1;
  // Target and drafter: a forward / micro-batch above this many tokens fails as out of memory
  // (the split-and-retry path on machines without a GPU). -1 = off.
  int64_t oom_above_tokens = -1;
};

WorkerTestHooks ReadWorkerTestHooks();

}  // namespace dflash::worker

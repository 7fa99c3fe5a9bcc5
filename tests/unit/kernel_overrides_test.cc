// Kernel switches from the environment are reported (services/worker_common/kernel_overrides.h),
// so that a run records them; none set: nothing reported.
#include "services/worker_common/kernel_overrides.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace dflash::worker {
namespace {

TEST(KernelOverrides, ReportsTheSwitchesSetAndNothingOtherwise) {
  for (const char* name : kKernelOverrideVariables) ::unsetenv(name);
  EXPECT_EQ(KernelOverrides(), "");
  ::setenv("DFLASH_FUSED_ROPE", "0", 1);
  ::setenv("DFLASH_ATTN_BWD_KERNEL", "mma", 1);
  EXPECT_EQ(KernelOverrides(), "DFLASH_FUSED_ROPE=0 DFLASH_ATTN_BWD_KERNEL=mma");
  for (const char* name : kKernelOverrideVariables) ::unsetenv(name);
}

}  // namespace
}  // namespace dflash::worker

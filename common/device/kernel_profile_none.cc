// ProfileKernels in a build without LibTorch: nothing to profile with.
#include "absl/status/status.h"
#include "common/device/kernel_profile.h"

namespace dflash::device {

absl::StatusOr<KernelProfile> ProfileKernels(const std::function<void()>&, bool) {
  return absl::UnimplementedError(
      "device kernel profiling needs LibTorch's profiler; this binary was built without LibTorch");
}

}  // namespace dflash::device

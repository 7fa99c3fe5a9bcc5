// Compiled only with LibTorch. Kept in its own file so that one translation unit pays for the
// c10 headers.
#include "common/device/device_probe.h"

#ifdef DFLASH_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dflash::device {

AllocatorStats TorchAllocatorStats(int gpu) {
  AllocatorStats out;
#ifdef DFLASH_HAVE_TORCH_CUDA
  if (gpu < 0 || gpu >= static_cast<int>(c10::cuda::device_count())) return out;
  using c10::CachingAllocator::StatType;
  c10::CachingDeviceAllocator::DeviceStats stats;
  try {
    stats = c10::cuda::CUDACachingAllocator::getDeviceStats(gpu);
  } catch (const c10::Error&) {
    // LibTorch initializes its allocator lazily, on the first CUDA tensor; before that it rejects
    // the device ("Invalid device argument") and, truthfully, nothing is allocated.
    return out;
  }
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  out.allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[agg].current);
  out.reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes[agg].current);
  out.peak_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[agg].peak);
#endif
  return out;
}

void ResetTorchPeak(int gpu) {
#ifdef DFLASH_HAVE_TORCH_CUDA
  if (gpu < 0 || gpu >= static_cast<int>(c10::cuda::device_count())) return;
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(gpu));
  } catch (const c10::Error&) {
    // Not initialized yet: there is no peak to reset.
  }
#else
  (void)gpu;
#endif
}

void ReleaseCachedMemory() {
#ifdef DFLASH_HAVE_TORCH_CUDA
  if (c10::cuda::device_count() == 0) return;
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (const c10::Error&) {
    // Not initialized yet: nothing is cached.
  }
#endif
}

void SynchronizeTorchDevice(int gpu) {
#ifdef DFLASH_HAVE_TORCH_CUDA
  if (gpu < 0 || gpu >= static_cast<int>(c10::cuda::device_count())) return;
  c10::cuda::device_synchronize();
#else
  (void)gpu;
#endif
}

}  // namespace dflash::device

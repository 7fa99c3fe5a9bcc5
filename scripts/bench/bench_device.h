// Device helpers of the benchmarks that time GPU work (those built with DFLASH_BENCH_CUDA where
// CUDA is; without it a CUDA device is never used).
#pragma once

#include <c10/core/Device.h>
#ifdef DFLASH_BENCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dflash::bench {

// Waits until `device` has finished the work queued on it; nothing to wait for on the CPU.
inline void Synchronize(const c10::Device& device) {
#ifdef DFLASH_BENCH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

}  // namespace dflash::bench

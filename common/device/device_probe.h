// What a worker knows about the device it owns: name, memory, and LibTorch allocator counters.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dflash::device {

struct DeviceMemory {
  std::string kind;  // "cpu" or "cuda"
  int index = -1;    // GPU ordinal, -1 for cpu
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int compute_capability = 0;  // major*10+minor
};

// gpu < 0 reads host memory (/proc/meminfo); gpu >= 0 asks the CUDA runtime. Fails with a message
// naming the GPU when it does not exist or the build has no CUDA.
absl::StatusOr<DeviceMemory> Probe(int gpu);

// Number of CUDA devices visible to this process (0 without CUDA or without a driver).
int CudaDeviceCount();

// Resident set size of this process, from /proc/self/statm.
uint64_t HostRssBytes();

// LibTorch CUDA caching allocator counters for `gpu` (all zero for gpu < 0 or without CUDA).
struct AllocatorStats {
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t peak_allocated_bytes = 0;
};
AllocatorStats TorchAllocatorStats(int gpu);
// Starts a new peak: the allocator's peak of allocated bytes becomes its current allocation (a
// no-op for gpu < 0, without CUDA, or before LibTorch's allocator exists).
void ResetTorchPeak(int gpu);
// Gives the blocks that LibTorch's caching allocator holds unused back to the driver, so that
// another process on the same GPU can have them (after an out-of-memory, what the failed attempt
// cached would otherwise stay this process's). A no-op without CUDA or before the allocator
// exists.
void ReleaseCachedMemory();
// Waits for every stream of `gpu` (a no-op for gpu < 0 or without CUDA): the end of a profiled
// step (kernel_profile.h needs its work to end on the device too).
void SynchronizeTorchDevice(int gpu);

}  // namespace dflash::device

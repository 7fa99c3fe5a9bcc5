// The checksum of a micro-batch's features on the device transports (cuda_ipc, nccl): the target
// computes it over the features it wrote and sends it in the message (DeviceFeatureRef), the
// drafter computes it over the features it is about to train on and refuses the batch when the
// two differ (DATA_LOSS). The host transport's messages carry the features themselves under the
// message's CRC-32 instead.
//
// Definition: the buffer as little-endian 32-bit words w_0 .. w_{n-1} (a last partial word padded
// with zero bytes), sum = Σ w_i and weighted = Σ (i + 1) · w_i, both mod 2^64. Any single flipped
// bit changes `sum`; any two different words exchanged change `weighted` (the change is
// (i - j)(w_j - w_i), two factors below 2^32, never 0 mod 2^64). One pass over the bytes on the
// device (memory-bound: ~0.1 ms for 335 MB on an H200).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace dflash::transport {

struct FeatureChecksum {
  uint64_t sum = 0;
  uint64_t weighted = 0;
  bool operator==(const FeatureChecksum& o) const { return sum == o.sum && weighted == o.weighted; }
  bool operator!=(const FeatureChecksum& o) const { return !(*this == o); }
};

// The reference, over host memory.
FeatureChecksum ChecksumHost(const void* data, size_t bytes);

// Over device memory on one device: a small device accumulator and a pinned result, reused by
// every call. Compute queues the kernel on the legacy default stream (LibTorch's default stream,
// behind the work that wrote the features) and waits for its result. Without CUDA, Create is
// UNIMPLEMENTED.
class DeviceChecksummer {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceChecksummer>> Create(int device);
  ~DeviceChecksummer();
  DeviceChecksummer(const DeviceChecksummer&) = delete;
  DeviceChecksummer& operator=(const DeviceChecksummer&) = delete;

  absl::StatusOr<FeatureChecksum> Compute(const void* data, size_t bytes);

 private:
  DeviceChecksummer() = default;
  int device_ = 0;
  unsigned long long* accumulator_ = nullptr;  // 2 words, device
  unsigned long long* result_ = nullptr;       // 2 words, pinned host
};

}  // namespace dflash::transport

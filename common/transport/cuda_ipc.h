// The `cuda_ipc` feature transport's device half (architecture.md, "Transports"): a target and a
// drafter process on the same GPU share feature buffers through CUDA IPC memory handles (NCCL
// refuses two ranks on one device). The target writes a micro-batch's features straight into a
// slot buffer; the small message that travels over the shared-memory ring (shm_ring.h) names the
// slot's handle, and the drafter reads the features in place, without a copy. Built on the CUDA
// runtime only; without CUDA every call is UNIMPLEMENTED.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace dflash::transport {

using IpcHandle = std::array<uint8_t, 64>;  // cudaIpcMemHandle_t, as bytes

// Producer: `slots` device buffers of `bytes` each on `device`, each with its IPC handle.
class CudaIpcSlots {
 public:
  static absl::StatusOr<std::unique_ptr<CudaIpcSlots>> Create(int device, uint32_t slots,
                                                              size_t bytes);
  ~CudaIpcSlots();
  CudaIpcSlots(const CudaIpcSlots&) = delete;
  CudaIpcSlots& operator=(const CudaIpcSlots&) = delete;

  void* slot(uint32_t i) const { return ptrs_[i]; }
  const IpcHandle& handle(uint32_t i) const { return handles_[i]; }
  uint32_t size() const { return static_cast<uint32_t>(ptrs_.size()); }
  size_t bytes() const { return bytes_; }

 private:
  CudaIpcSlots() = default;
  int device_ = 0;
  size_t bytes_ = 0;
  std::vector<void*> ptrs_;
  std::vector<IpcHandle> handles_;
};

// Consumer: opens peers' handles on `device` once each and keeps them open until destroyed.
class CudaIpcMappings {
 public:
  explicit CudaIpcMappings(int device) : device_(device) {}
  ~CudaIpcMappings();
  CudaIpcMappings(const CudaIpcMappings&) = delete;
  CudaIpcMappings& operator=(const CudaIpcMappings&) = delete;
  absl::StatusOr<void*> Open(const IpcHandle& handle);

 private:
  int device_;
  std::map<IpcHandle, void*> open_;
};

// Waits for all work queued on `device` (the writer before publishing a slot, the reader before
// handing it back).
absl::Status SynchronizeDevice(int device);

}  // namespace dflash::transport

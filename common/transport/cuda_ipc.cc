#include "common/transport/cuda_ipc.h"

#include "absl/strings/str_cat.h"
#include "common/transport/cuda_status.h"

#if DFLASH_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstring>
#endif

namespace dflash::transport {

#if DFLASH_HAVE_CUDA
namespace {

static_assert(cudaSuccess == kCudaSuccess &&
                  cudaErrorMemoryAllocation == kCudaErrorMemoryAllocation,
              "cuda_status.h's codes are the CUDA runtime's");

absl::Status Check(cudaError_t e, const char* what) {
  return CudaStatus(e, cudaGetErrorString(e), absl::StrCat("cuda_ipc: ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcSlots>> CudaIpcSlots::Create(int device, uint32_t slots,
                                                                   size_t bytes) {
  std::unique_ptr<CudaIpcSlots> s(new CudaIpcSlots());
  s->device_ = device;
  s->bytes_ = bytes;
  if (absl::Status st = Check(cudaSetDevice(device), "cudaSetDevice"); !st.ok()) return st;
  for (uint32_t i = 0; i < slots; ++i) {
    void* p = nullptr;
    if (absl::Status st = Check(cudaMalloc(&p, bytes), "cudaMalloc of a feature slot"); !st.ok()) {
      return st;
    }
    s->ptrs_.push_back(p);
    cudaIpcMemHandle_t h;
    if (absl::Status st = Check(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle"); !st.ok()) {
      return st;
    }
    IpcHandle bytes_of;
    static_assert(sizeof(h) == sizeof(IpcHandle), "cudaIpcMemHandle_t is 64 bytes");
    std::memcpy(bytes_of.data(), &h, sizeof(h));
    s->handles_.push_back(bytes_of);
  }
  return s;
}

CudaIpcSlots::~CudaIpcSlots() {
  if (ptrs_.empty()) return;
  cudaSetDevice(device_);
  for (void* p : ptrs_) cudaFree(p);
}

CudaIpcMappings::~CudaIpcMappings() {
  if (open_.empty()) return;
  cudaSetDevice(device_);
  for (const auto& [h, p] : open_) cudaIpcCloseMemHandle(p);
}

absl::StatusOr<void*> CudaIpcMappings::Open(const IpcHandle& handle) {
  auto it = open_.find(handle);
  if (it != open_.end()) return it->second;
  if (absl::Status st = Check(cudaSetDevice(device_), "cudaSetDevice"); !st.ok()) return st;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  if (absl::Status st = Check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                              "cudaIpcOpenMemHandle (is the target on the same GPU?)");
      !st.ok()) {
    return st;
  }
  open_[handle] = p;
  return p;
}

absl::Status SynchronizeDevice(int device) {
  if (absl::Status st = Check(cudaSetDevice(device), "cudaSetDevice"); !st.ok()) return st;
  return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

#else  // !DFLASH_HAVE_CUDA

namespace {
absl::Status NoCuda() {
  return absl::UnimplementedError("cuda_ipc: this build has no CUDA (placement.transport: host)");
}
}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcSlots>> CudaIpcSlots::Create(int, uint32_t, size_t) {
  return NoCuda();
}
CudaIpcSlots::~CudaIpcSlots() = default;
CudaIpcMappings::~CudaIpcMappings() = default;
absl::StatusOr<void*> CudaIpcMappings::Open(const IpcHandle&) { return NoCuda(); }
absl::Status SynchronizeDevice(int) { return NoCuda(); }

#endif

}  // namespace dflash::transport

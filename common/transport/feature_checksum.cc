#include "common/transport/feature_checksum.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/transport/cuda_status.h"

#if DFLASH_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace dflash::transport {

#if DFLASH_HAVE_CUDA
// feature_checksum.cu: queues the memset of `accumulator`, the kernel and the copy of the result
// into `result` on the legacy default stream.
cudaError_t LaunchFeatureChecksum(const void* data, size_t bytes, unsigned long long* accumulator,
                                  unsigned long long* result);
#endif

FeatureChecksum ChecksumHost(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  FeatureChecksum c;
  const size_t words = (bytes + 3) / 4;
  for (size_t i = 0; i < words; ++i) {
    uint32_t w = 0;
    const size_t take = i * 4 + 4 <= bytes ? 4 : bytes - i * 4;
    std::memcpy(&w, p + i * 4, take);  // little-endian host: as the device reads it
    c.sum += w;
    c.weighted += static_cast<uint64_t>(i + 1) * w;
  }
  return c;
}

#if DFLASH_HAVE_CUDA
namespace {
absl::Status Check(cudaError_t e, const char* what) {
  return CudaStatus(e, cudaGetErrorString(e), absl::StrCat("feature checksum: ", what));
}
}  // namespace

absl::StatusOr<std::unique_ptr<DeviceChecksummer>> DeviceChecksummer::Create(int device) {
  std::unique_ptr<DeviceChecksummer> c(new DeviceChecksummer());
  c->device_ = device;
  if (absl::Status s = Check(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  void* acc = nullptr;
  if (absl::Status s = Check(cudaMalloc(&acc, 2 * sizeof(unsigned long long)), "cudaMalloc");
      !s.ok()) {
    return s;
  }
  c->accumulator_ = static_cast<unsigned long long*>(acc);
  void* host = nullptr;
  if (absl::Status s =
          Check(cudaMallocHost(&host, 2 * sizeof(unsigned long long)), "cudaMallocHost");
      !s.ok()) {
    return s;
  }
  c->result_ = static_cast<unsigned long long*>(host);
  return c;
}

DeviceChecksummer::~DeviceChecksummer() {
  if (accumulator_ != nullptr) {
    cudaSetDevice(device_);
    cudaFree(accumulator_);
  }
  if (result_ != nullptr) cudaFreeHost(result_);
}

absl::StatusOr<FeatureChecksum> DeviceChecksummer::Compute(const void* data, size_t bytes) {
  if (absl::Status s = Check(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  if (absl::Status s = Check(LaunchFeatureChecksum(data, bytes, accumulator_, result_), "launch");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize"); !s.ok()) {
    return s;
  }
  return FeatureChecksum{result_[0], result_[1]};
}

#else  // !DFLASH_HAVE_CUDA

absl::StatusOr<std::unique_ptr<DeviceChecksummer>> DeviceChecksummer::Create(int) {
  return absl::UnimplementedError("feature checksum on the device: this build has no CUDA");
}
DeviceChecksummer::~DeviceChecksummer() = default;
absl::StatusOr<FeatureChecksum> DeviceChecksummer::Compute(const void*, size_t) {
  return absl::UnimplementedError("feature checksum on the device: this build has no CUDA");
}

#endif

}  // namespace dflash::transport

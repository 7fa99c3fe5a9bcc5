// CudaStatus (common/transport/cuda_status.h): a CUDA allocation failure in a transport is an
// out-of-memory (RESOURCE_EXHAUSTED), every other CUDA error INTERNAL, both naming where.
#include "common/transport/cuda_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dflash::transport {
namespace {

TEST(CudaStatus, AllocationFailureIsOutOfMemoryAndOtherErrorsInternal) {
  EXPECT_TRUE(CudaStatus(kCudaSuccess, "no error", "cuda_ipc: cudaMalloc").ok());
  absl::Status oom =
      CudaStatus(kCudaErrorMemoryAllocation, "out of memory", "cuda_ipc: cudaMalloc");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(), "cuda_ipc: cudaMalloc: out of memory");
  absl::Status other = CudaStatus(700, "an illegal memory access was encountered",
                                  "nccl channel: cudaStreamSynchronize");
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(other.message(),
            "nccl channel: cudaStreamSynchronize: an illegal memory access was encountered");
}

}  // namespace
}  // namespace dflash::transport

// Every out-of-memory that reaches LibTorch is RESOURCE_EXHAUSTED (common/nn/torch_status.h). A
// real host allocation failure (1 PiB, beyond the address space) is raised for real; the GPU
// libraries' allocation failures (cuBLAS/cuBLASLt handles and workspaces, cuDNN, the CUDA
// runtime) cannot be raised on this CPU-only test, so their messages, as LibTorch words them,
// are injected as c10::Error.
#include "common/nn/torch_status.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <string>

namespace dflash::nn {
namespace {

c10::Error ErrorWith(const std::string& message) {
  return c10::Error(c10::SourceLocation{__func__, __FILE__, __LINE__}, message);
}

TEST(TorchStatus, ARealHostAllocationFailureIsResourceExhausted) {
  try {
    at::Tensor t = at::empty({int64_t{1} << 50}, at::kByte);
    FAIL() << "allocated 1 PiB";
  } catch (const c10::Error& e) {
    EXPECT_TRUE(IsOutOfMemory(e)) << e.what_without_backtrace();
    absl::Status s = TorchStatus(e, "allocating");
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(s.message().rfind("allocating: ", 0), 0u) << s;
  }
}

TEST(TorchStatus, GpuLibraryAllocationFailuresAreResourceExhausted) {
  for (const char* m :
       {"CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasLtMatmul with transpose_mat1",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "CUDA error: out of memory",
        "CUDA out of memory. Tried to allocate 2.00 GiB", "cudaErrorMemoryAllocation"}) {
    EXPECT_EQ(TorchStatus(ErrorWith(m), "drafter backward").code(),
              absl::StatusCode::kResourceExhausted)
        << m;
  }
  for (const char* m : {"CUDA error: an illegal memory access was encountered",
                        "CUBLAS_STATUS_EXECUTION_FAILED", "shape '[2, 3]' is invalid"}) {
    absl::Status s = TorchStatus(ErrorWith(m), "drafter backward");
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << m;
    EXPECT_EQ(s.message(), std::string("drafter backward: ") + m);
  }
}

}  // namespace
}  // namespace dflash::nn

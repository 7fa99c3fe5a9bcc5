#include "common/nn/torch_status.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dflash::nn {

bool IsOutOfMemoryMessage(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(message, "ALLOC_FAILED") ||  // CUBLAS_/CUDNN_STATUS_ALLOC_FAILED
         absl::StrContains(lower, "out of memory") ||   // CUDA runtime, caching allocator
         absl::StrContains(message, "cudaErrorMemoryAllocation") ||
         // The host allocator: "DefaultCPUAllocator: can't allocate memory ... (Cannot allocate
         // memory)", a plain c10::Error.
         absl::StrContains(lower, "can't allocate memory") ||
         absl::StrContains(lower, "cannot allocate memory");
}

bool IsOutOfMemory(const c10::Error& e) {
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
         IsOutOfMemoryMessage(e.what_without_backtrace());
}

absl::Status TorchStatus(const c10::Error& e, absl::string_view operation) {
  std::string message = absl::StrCat(operation, ": ", e.what_without_backtrace());
  return IsOutOfMemory(e) ? absl::ResourceExhaustedError(std::move(message))
                          : absl::InternalError(std::move(message));
}

}  // namespace dflash::nn

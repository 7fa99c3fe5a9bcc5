#include "common/transport/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace dflash::transport {

absl::Status CudaStatus(int code, absl::string_view message, absl::string_view context) {
  if (code == kCudaSuccess) return absl::OkStatus();
  const std::string text = absl::StrCat(context, ": ", message);
  if (code == kCudaErrorMemoryAllocation) return absl::ResourceExhaustedError(text);
  return absl::InternalError(text);
}

}  // namespace dflash::transport

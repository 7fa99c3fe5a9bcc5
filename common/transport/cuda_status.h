// The status of a CUDA runtime call in the transports (CUDA IPC slots, the NCCL channel and
// communicator, the feature checksum): OK for cudaSuccess, RESOURCE_EXHAUSTED for
// cudaErrorMemoryAllocation (an out-of-memory: the coordinator pauses a run on it rather than
// failing it, docs/memory.md#out-of-memory), INTERNAL otherwise; the message is
// "<context>: <CUDA's message>". Takes the code as an int so that callers without the CUDA
// headers (and its tests) use it too.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dflash::transport {

inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorMemoryAllocation = 2;  // cudaErrorMemoryAllocation

absl::Status CudaStatus(int code, absl::string_view message, absl::string_view context);

}  // namespace dflash::transport

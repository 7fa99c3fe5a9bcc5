// LibTorch errors as statuses, with every out-of-memory recognized as one: the caching allocator's
// c10::OutOfMemoryError, and the allocation failures that reach LibTorch as plain c10::Error
// messages (cuBLAS and cuBLASLt "CUBLAS_STATUS_ALLOC_FAILED" when a handle or workspace cannot be
// allocated, cuDNN "CUDNN_STATUS_ALLOC_FAILED", the CUDA runtime's "out of memory", the host
// allocator's "can't allocate memory"). The trainer and the target worker split a micro-batch on
// RESOURCE_EXHAUSTED, so a missed one fails a run that a retry would have saved.
#pragma once

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dflash::nn {

bool IsOutOfMemory(const c10::Error& e);
// The text an allocation failure carries (for errors that arrive as messages, e.g. from NCCL).
bool IsOutOfMemoryMessage(absl::string_view message);

// RESOURCE_EXHAUSTED "<operation>: <message>" for an out-of-memory, INTERNAL otherwise.
absl::Status TorchStatus(const c10::Error& e, absl::string_view operation);

}  // namespace dflash::nn

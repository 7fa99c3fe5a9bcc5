// One check for every kernel launch of the LibTorch bindings (the launchers return a cudaError_t
// as int): throws c10::Error "<context>: <CUDA's message>" unless the launch succeeded, so that
// LibTorch's callers see it as any failed operation (common/nn/torch_status.h turns an allocation
// failure among them into RESOURCE_EXHAUSTED).
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace dflash::kernels {

inline void CheckLaunch(int err, const char* context) {
  TORCH_CHECK(err == cudaSuccess, context, ": ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace dflash::kernels

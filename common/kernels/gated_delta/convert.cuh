// Loads and stores of the packed tensors' dtypes as fp32 (the gated delta rule's kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dflash::kernels::gdr {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half(x);
}

}  // namespace dflash::kernels::gdr

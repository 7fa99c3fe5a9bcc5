// Element loads and stores of the kernels' dtypes as fp32: ToFloat(x) and FromFloat<T>(v) (round
// to nearest even) for float, bf16 and fp16. Shared by the kernels' launch files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dflash::kernels {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half(v);
}

}  // namespace dflash::kernels

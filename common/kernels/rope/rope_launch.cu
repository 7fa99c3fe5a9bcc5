// One thread per (row, head, column pair d, d + dim/2): both outputs of the pair from both inputs
// and the row's tables, in fp32. Consecutive threads take consecutive d, so each warp reads and
// writes contiguous runs of the two halves.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kernels/rope/params.h"

namespace dflash::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float Load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void Store(__half* p, float v) { *p = __float2half(v); }

template <typename T, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin,
               T* __restrict__ out, int64_t rows, int64_t heads, int64_t dim) {
  const int64_t half = dim / 2;
  const int64_t pairs = rows * heads * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t d = i % half, rh = i / half, row = rh / heads;
    const T* xr = x + rh * dim;
    const T* c = cos + row * dim;
    const T* s = sin + row * dim;
    const float x1 = Load(xr + d), x2 = Load(xr + d + half);
    const float c1 = Load(c + d), c2 = Load(c + d + half);
    const float s1 = Load(s + d), s2 = Load(s + d + half);
    T* o = out + rh * dim;
    if (kBackward) {
      Store(o + d, x1 * c1 + x2 * s2);
      Store(o + d + half, x2 * c2 - x1 * s1);
    } else {
      Store(o + d, x1 * c1 - x2 * s1);
      Store(o + d + half, x2 * c2 + x1 * s2);
    }
  }
}

template <typename T>
int Launch(const RopeParams& p, cudaStream_t stream) {
  const int64_t pairs = p.rows * p.heads * (p.dim / 2);
  if (pairs == 0) return cudaSuccess;
  const int64_t want = (pairs + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 16 ? want : 65535 * 16);
  const T* x = static_cast<const T*>(p.x);
  const T* c = static_cast<const T*>(p.cos);
  const T* s = static_cast<const T*>(p.sin);
  T* o = static_cast<T*>(p.out);
  if (p.backward) {
    RopeKernel<T, true><<<blocks, kThreads, 0, stream>>>(x, c, s, o, p.rows, p.heads, p.dim);
  } else {
    RopeKernel<T, false><<<blocks, kThreads, 0, stream>>>(x, c, s, o, p.rows, p.heads, p.dim);
  }
  return cudaGetLastError();
}

}  // namespace

int LaunchRope(const RopeParams& p, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.dim <= 0 || p.dim % 2 != 0) return cudaErrorInvalidValue;
  switch (p.dtype) {
    case RopeDType::kFloat32:
      return Launch<float>(p, st);
    case RopeDType::kBFloat16:
      return Launch<__nv_bfloat16>(p, st);
    case RopeDType::kFloat16:
      return Launch<__half>(p, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dflash::kernels

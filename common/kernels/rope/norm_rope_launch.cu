// One warp per (row, head): lane l holds the first-half elements l, l + 32, ... and their partners
// dim/2 further on, so the row's sum of squares is one warp reduction and each rotated pair is
// in one lane's registers. Consecutive lanes read consecutive elements of a half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kernels/float_convert.cuh"
#include "common/kernels/rope/params.h"

namespace dflash::kernels {
namespace {

constexpr int kWarps = 8;

// kPairs = dim / 64 rotated pairs per lane.
template <typename T, int kPairs>
__global__ void __launch_bounds__(kWarps * 32)
    NormRopeKernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ cos,
                   const T* __restrict__ sin, T* __restrict__ out, int64_t rows, int64_t heads,
                   int64_t row_stride, float eps) {
  constexpr int kDim = 64 * kPairs, kHalf = kDim / 2;
  const int lane = threadIdx.x & 31;
  const int64_t total = rows * heads;
  for (int64_t rh = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; rh < total;
       rh += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t row = rh / heads, head = rh % heads;
    const T* xr = x + row * row_stride + head * kDim;
    float a[kPairs], b[kPairs];
    float ss = 0.f;
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      a[p] = ToFloat(xr[lane + 32 * p]);
      b[p] = ToFloat(xr[kHalf + lane + 32 * p]);
      ss += a[p] * a[p] + b[p] * b[p];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float r = rsqrtf(ss / kDim + eps);
    const T* c = cos + row * kDim;
    const T* s = sin + row * kDim;
    T* o = out + rh * kDim;
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      const int e = lane + 32 * p;
      // The normed value rounded as at::rms_norm hands it to RoPE.
      const float n1 = ToFloat(FromFloat<T>(a[p] * r * ToFloat(weight[e])));
      const float n2 = ToFloat(FromFloat<T>(b[p] * r * ToFloat(weight[e + kHalf])));
      o[e] = FromFloat<T>(n1 * ToFloat(c[e]) - n2 * ToFloat(s[e]));
      o[e + kHalf] = FromFloat<T>(n2 * ToFloat(c[e + kHalf]) + n1 * ToFloat(s[e + kHalf]));
    }
  }
}

template <typename T, int kPairs>
int Launch(const NormRopeParams& p, cudaStream_t stream) {
  const int64_t total = p.rows * p.heads;
  if (total == 0) return cudaSuccess;
  const int64_t want = (total + kWarps - 1) / kWarps;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 16 ? want : 65535 * 16);
  NormRopeKernel<T, kPairs><<<blocks, kWarps * 32, 0, stream>>>(
      static_cast<const T*>(p.x), static_cast<const T*>(p.weight), static_cast<const T*>(p.cos),
      static_cast<const T*>(p.sin), static_cast<T*>(p.out), p.rows, p.heads, p.row_stride, p.eps);
  return cudaGetLastError();
}

template <typename T>
int LaunchDim(const NormRopeParams& p, cudaStream_t stream) {
  switch (p.dim) {
    case 64:
      return Launch<T, 1>(p, stream);
    case 128:
      return Launch<T, 2>(p, stream);
    case 256:
      return Launch<T, 4>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int LaunchNormRope(const NormRopeParams& p, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.row_stride < p.heads * p.dim) return cudaErrorInvalidValue;
  switch (p.dtype) {
    case RopeDType::kFloat32:
      return LaunchDim<float>(p, st);
    case RopeDType::kBFloat16:
      return LaunchDim<__nv_bfloat16>(p, st);
    case RopeDType::kFloat16:
      return LaunchDim<__half>(p, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dflash::kernels

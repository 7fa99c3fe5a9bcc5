// One thread per group of 8 elements (16-byte loads and stores for bf16 / fp16 when every pointer
// is 16-byte aligned and n a multiple of 8, and in rows mode cols and ld too; else one element per
// thread), fp32 arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kernels/float_convert.cuh"
#include "common/kernels/swiglu/params.h"

namespace dflash::kernels {
namespace {

constexpr int kThreads = 256;

// `kVec` elements at once: one 16-byte access for 2-byte types with kVec = 8.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Output elements i .. i + kVec - 1, whose inputs start at g + in and u + in.
template <typename T, int kVec>
__device__ __forceinline__ void Forward(const T* __restrict__ g, const T* __restrict__ u,
                                        T* __restrict__ out, int64_t i, int64_t in) {
  const Pack<T, kVec> gv = *reinterpret_cast<const Pack<T, kVec>*>(g + in);
  const Pack<T, kVec> uv = *reinterpret_cast<const Pack<T, kVec>*>(u + in);
  Pack<T, kVec> ov;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float x = ToFloat(gv.v[k]);
    const float s = x / (1.0f + __expf(-x));
    ov.v[k] = FromFloat<T>(s * ToFloat(uv.v[k]));
  }
  *reinterpret_cast<Pack<T, kVec>*>(out + i) = ov;
}

// dg may alias da (each element is read before it is written, by the same thread).
template <typename T, int kVec>
__device__ __forceinline__ void Backward(const T* da, const T* __restrict__ g,
                                         const T* __restrict__ u, T* dg, T* __restrict__ du,
                                         int64_t i) {
  const Pack<T, kVec> av = *reinterpret_cast<const Pack<T, kVec>*>(da + i);
  const Pack<T, kVec> gv = *reinterpret_cast<const Pack<T, kVec>*>(g + i);
  const Pack<T, kVec> uv = *reinterpret_cast<const Pack<T, kVec>*>(u + i);
  Pack<T, kVec> gout, uout;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float x = ToFloat(gv.v[k]), a = ToFloat(av.v[k]);
    const float sigma = 1.0f / (1.0f + __expf(-x));
    uout.v[k] = FromFloat<T>(a * x * sigma);
    gout.v[k] = FromFloat<T>(a * ToFloat(uv.v[k]) * sigma * (1.0f + x * (1.0f - sigma)));
  }
  *reinterpret_cast<Pack<T, kVec>*>(du + i) = uout;
  *reinterpret_cast<Pack<T, kVec>*>(dg + i) = gout;
}

// kRows: the forward over rows (SwiGluParams::cols); a group of kVec never spans two rows
// (cols % kVec == 0).
template <typename T, int kVec, bool kBackward, bool kRows>
__global__ void __launch_bounds__(kThreads) SwiGluKernel(SwiGluParams p) {
  const T* g = static_cast<const T*>(p.g);
  const T* u = static_cast<const T*>(p.u);
  const int64_t groups = p.n / kVec;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; j < groups;
       j += static_cast<int64_t>(gridDim.x) * kThreads) {
    if (kBackward) {
      Backward<T, kVec>(static_cast<const T*>(p.da), g, u, static_cast<T*>(p.out),
                        static_cast<T*>(p.du), j * kVec);
    } else if (kRows) {
      const int64_t i = j * kVec, r = i / p.cols;
      Forward<T, kVec>(g, u, static_cast<T*>(p.out), i, r * p.ld + (i - r * p.cols));
    } else {
      Forward<T, kVec>(g, u, static_cast<T*>(p.out), j * kVec, j * kVec);
    }
  }
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename T, int kVec>
int LaunchWith(const SwiGluParams& p, cudaStream_t stream) {
  const int64_t groups = p.n / kVec;
  const int64_t want = (groups + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 16 ? want : 65535 * 16);
  if (p.backward) {
    SwiGluKernel<T, kVec, true, false><<<blocks, kThreads, 0, stream>>>(p);
  } else if (p.cols > 0) {
    SwiGluKernel<T, kVec, false, true><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    SwiGluKernel<T, kVec, false, false><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
int Launch(const SwiGluParams& p, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  const bool rows_fit = p.cols == 0 || (p.cols % kWide == 0 && p.ld % kWide == 0);
  const bool wide = p.n % kWide == 0 && rows_fit && Aligned16(p.g) && Aligned16(p.u) &&
                    Aligned16(p.out) && (!p.backward || (Aligned16(p.da) && Aligned16(p.du)));
  return wide ? LaunchWith<T, kWide>(p, stream) : LaunchWith<T, 1>(p, stream);
}

}  // namespace

int LaunchSwiGlu(const SwiGluParams& p, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.n < 0 || (p.backward && (p.da == nullptr || p.du == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (p.cols < 0 || (p.cols > 0 && (p.backward || p.ld < p.cols || p.n % p.cols != 0))) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0) return cudaSuccess;
  switch (p.dtype) {
    case SwiGluDType::kFloat32:
      return Launch<float>(p, st);
    case SwiGluDType::kBFloat16:
      return Launch<__nv_bfloat16>(p, st);
    case SwiGluDType::kFloat16:
      return Launch<__half>(p, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dflash::kernels

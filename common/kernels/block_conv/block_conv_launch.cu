// One thread per output element (coalesced over channels), fp32 arithmetic; the three backward
// outputs in three kernels (dx elementwise, ddelta a reduction over a group's channels, dbase a
// reduction over a tile of rows). Bandwidth-bound: the forward reads x (its shifted rows from
// cache) and writes out once, where LibTorch's composition made about eight passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kernels/block_conv/params.h"
#include "common/kernels/float_convert.cuh"

namespace dflash::kernels {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t work) {
  const int64_t want = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(want < 65535 * 16 ? want : 65535 * 16);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ForwardKernel(BlockConvParams p) {
  const T* x = static_cast<const T*>(p.x);
  const T* delta = static_cast<const T*>(p.delta);
  T* out = static_cast<T*>(p.out);
  const int64_t n = p.rows * p.h, groups = p.h / p.group;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / p.h, c = i - r * p.h, slot = r % p.block, g = c / p.group;
    float acc = 0.f;
    for (int64_t t = 0; t < p.kernel && t <= slot; ++t) {
      const float coef = p.base[t * p.h + c] + ToFloat(delta[(r * p.kernel + t) * groups + g]);
      acc += ToFloat(x[i - t * p.h]) * coef;
    }
    out[i] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) GradXKernel(BlockConvParams p) {
  const T* dy = static_cast<const T*>(p.dy);
  const T* delta = static_cast<const T*>(p.delta);
  T* dx = static_cast<T*>(p.dx);
  const int64_t n = p.rows * p.h, groups = p.h / p.group;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / p.h, c = i - r * p.h, slot = r % p.block, g = c / p.group;
    float acc = 0.f;
    for (int64_t t = 0; t < p.kernel && slot + t < p.block; ++t) {
      const float coef =
          p.base[t * p.h + c] + ToFloat(delta[((r + t) * p.kernel + t) * groups + g]);
      acc += ToFloat(dy[i + t * p.h]) * coef;
    }
    dx[i] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) GradDeltaKernel(BlockConvParams p) {
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  T* ddelta = static_cast<T*>(p.ddelta);
  const int64_t groups = p.h / p.group, n = p.rows * p.kernel * groups;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t g = i % groups, rt = i / groups, t = rt % p.kernel, r = rt / p.kernel;
    float acc = 0.f;
    if (r % p.block >= t) {
      const T* dy_row = dy + r * p.h + g * p.group;
      const T* x_row = x + (r - t) * p.h + g * p.group;
      for (int64_t j = 0; j < p.group; ++j) acc += ToFloat(dy_row[j]) * ToFloat(x_row[j]);
    }
    ddelta[i] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) GradBaseKernel(BlockConvParams p) {
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  const int64_t tiles = (p.rows + p.tile_rows - 1) / p.tile_rows, n = tiles * p.h;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t tile = i / p.h, c = i - tile * p.h;
    const int64_t r0 = tile * p.tile_rows;
    const int64_t r1 = r0 + p.tile_rows < p.rows ? r0 + p.tile_rows : p.rows;
    for (int64_t t = 0; t < p.kernel; ++t) {
      float acc = 0.f;
      for (int64_t r = r0; r < r1; ++r) {
        if (r % p.block >= t) acc += ToFloat(dy[r * p.h + c]) * ToFloat(x[(r - t) * p.h + c]);
      }
      p.dbase_partial[(tile * p.kernel + t) * p.h + c] = acc;
    }
  }
}

bool Valid(const BlockConvParams& p) {
  return p.rows >= 0 && p.h > 0 && p.kernel >= 1 && p.block >= 1 && p.kernel <= p.block &&
         p.group >= 1 && p.h % p.group == 0 && p.rows % p.block == 0 && p.tile_rows >= 1 &&
         p.x != nullptr && p.delta != nullptr && p.base != nullptr;
}

template <typename T>
int Forward(const BlockConvParams& p, cudaStream_t stream) {
  ForwardKernel<T><<<Blocks(p.rows * p.h), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
int Backward(const BlockConvParams& p, cudaStream_t stream) {
  GradXKernel<T><<<Blocks(p.rows * p.h), kThreads, 0, stream>>>(p);
  GradDeltaKernel<T><<<Blocks(p.rows * p.kernel * (p.h / p.group)), kThreads, 0, stream>>>(p);
  const int64_t tiles = (p.rows + p.tile_rows - 1) / p.tile_rows;
  GradBaseKernel<T><<<Blocks(tiles * p.h), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <template <typename> class Op>
int Dispatch(const BlockConvParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case BlockConvDType::kFloat32:
      return Op<float>::Run(p, stream);
    case BlockConvDType::kBFloat16:
      return Op<__nv_bfloat16>::Run(p, stream);
    case BlockConvDType::kFloat16:
      return Op<__half>::Run(p, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
struct ForwardOp {
  static int Run(const BlockConvParams& p, cudaStream_t s) { return Forward<T>(p, s); }
};
template <typename T>
struct BackwardOp {
  static int Run(const BlockConvParams& p, cudaStream_t s) { return Backward<T>(p, s); }
};

}  // namespace

int LaunchBlockConvForward(const BlockConvParams& p, void* stream) {
  if (!Valid(p) || p.out == nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  return Dispatch<ForwardOp>(p, static_cast<cudaStream_t>(stream));
}

int LaunchBlockConvBackward(const BlockConvParams& p, void* stream) {
  if (!Valid(p) || p.dy == nullptr || p.dx == nullptr || p.ddelta == nullptr ||
      p.dbase_partial == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  return Dispatch<BackwardOp>(p, static_cast<cudaStream_t>(stream));
}

}  // namespace dflash::kernels

// One thread per channel and row (coalesced over channels; 2-D grids, so 32-bit index arithmetic),
// fp32 arithmetic; the three backward outputs in three kernels (dx elementwise, ddelta a reduction
// over a group's channels, dbase a reduction over a tile of rows). Bandwidth-bound: the forward
// reads x (its shifted rows from cache) and writes out once, where LibTorch's composition made
// about eight passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kernels/block_conv/params.h"
#include "common/kernels/float_convert.cuh"

namespace dflash::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

// A 2-D grid: x over the columns (channels, or a row's (tap, group) pairs), y striding over the
// rows, so that every index is a product and a 32-bit division or two per thread and row, not a
// 64-bit division per element.
dim3 Grid(int64_t columns, int64_t rows) {
  const int64_t x = (columns + kThreads - 1) / kThreads;
  const int64_t y = rows < kMaxGridY ? (rows > 0 ? rows : 1) : kMaxGridY;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ForwardKernel(BlockConvParams p) {
  const T* x = static_cast<const T*>(p.x);
  const T* delta = static_cast<const T*>(p.delta);
  T* out = static_cast<T*>(p.out);
  const int h = static_cast<int>(p.h), kernel = static_cast<int>(p.kernel);
  const int block = static_cast<int>(p.block), groups = static_cast<int>(p.h / p.group);
  const int c = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (c >= h) return;
  const int g = c / static_cast<int>(p.group);
  for (int r = static_cast<int>(blockIdx.y); r < static_cast<int>(p.rows);
       r += static_cast<int>(gridDim.y)) {
    const int slot = r % block;
    const int64_t i = static_cast<int64_t>(r) * h + c;
    float acc = 0.f;
    for (int t = 0; t < kernel && t <= slot; ++t) {
      const float coef =
          p.base[t * h + c] + ToFloat(delta[(static_cast<int64_t>(r) * kernel + t) * groups + g]);
      acc += ToFloat(x[i - static_cast<int64_t>(t) * h]) * coef;
    }
    out[i] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) GradXKernel(BlockConvParams p) {
  const T* dy = static_cast<const T*>(p.dy);
  const T* delta = static_cast<const T*>(p.delta);
  T* dx = static_cast<T*>(p.dx);
  const int h = static_cast<int>(p.h), kernel = static_cast<int>(p.kernel);
  const int block = static_cast<int>(p.block), groups = static_cast<int>(p.h / p.group);
  const int c = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (c >= h) return;
  const int g = c / static_cast<int>(p.group);
  for (int r = static_cast<int>(blockIdx.y); r < static_cast<int>(p.rows);
       r += static_cast<int>(gridDim.y)) {
    const int slot = r % block;
    const int64_t i = static_cast<int64_t>(r) * h + c;
    float acc = 0.f;
    for (int t = 0; t < kernel && slot + t < block; ++t) {
      const float coef = p.base[t * h + c] +
                         ToFloat(delta[(static_cast<int64_t>(r + t) * kernel + t) * groups + g]);
      acc += ToFloat(dy[i + static_cast<int64_t>(t) * h]) * coef;
    }
    dx[i] = FromFloat<T>(acc);
  }
}

// x over a row's (tap, group) pairs, y over the rows: the group's channels summed in a loop.
template <typename T>
__global__ void __launch_bounds__(kThreads) GradDeltaKernel(BlockConvParams p) {
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  T* ddelta = static_cast<T*>(p.ddelta);
  const int h = static_cast<int>(p.h), kernel = static_cast<int>(p.kernel);
  const int block = static_cast<int>(p.block), group = static_cast<int>(p.group);
  const int groups = h / group;
  const int j = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (j >= kernel * groups) return;
  const int t = j / groups, g = j - t * groups;
  for (int r = static_cast<int>(blockIdx.y); r < static_cast<int>(p.rows);
       r += static_cast<int>(gridDim.y)) {
    float acc = 0.f;
    if (r % block >= t) {
      const T* dy_row = dy + static_cast<int64_t>(r) * h + g * group;
      const T* x_row = x + static_cast<int64_t>(r - t) * h + g * group;
      for (int k = 0; k < group; ++k) acc += ToFloat(dy_row[k]) * ToFloat(x_row[k]);
    }
    ddelta[static_cast<int64_t>(r) * kernel * groups + j] = FromFloat<T>(acc);
  }
}

// x over the channels, y over tiles of rows: one partial sum per (tile, tap, channel).
template <typename T>
__global__ void __launch_bounds__(kThreads) GradBaseKernel(BlockConvParams p) {
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  const int h = static_cast<int>(p.h), kernel = static_cast<int>(p.kernel);
  const int block = static_cast<int>(p.block), tile_rows = static_cast<int>(p.tile_rows);
  const int rows = static_cast<int>(p.rows), tiles = (rows + tile_rows - 1) / tile_rows;
  const int c = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (c >= h) return;
  for (int tile = static_cast<int>(blockIdx.y); tile < tiles; tile += static_cast<int>(gridDim.y)) {
    const int r0 = tile * tile_rows, r1 = r0 + tile_rows < rows ? r0 + tile_rows : rows;
    for (int t = 0; t < kernel; ++t) {
      float acc = 0.f;
      for (int r = r0; r < r1; ++r) {
        if (r % block >= t) {
          acc += ToFloat(dy[static_cast<int64_t>(r) * h + c]) *
                 ToFloat(x[static_cast<int64_t>(r - t) * h + c]);
        }
      }
      p.dbase_partial[(static_cast<int64_t>(tile) * kernel + t) * h + c] = acc;
    }
  }
}

bool Valid(const BlockConvParams& p) {
  // 32-bit row, channel and (tap, group) indices in the kernels.
  constexpr int64_t kIntMax = 2147483647;
  if (p.rows > kIntMax || p.h > kIntMax / 2 || p.kernel * p.h > kIntMax) return false;
  return p.rows >= 0 && p.h > 0 && p.kernel >= 1 && p.block >= 1 && p.kernel <= p.block &&
         p.group >= 1 && p.h % p.group == 0 && p.rows % p.block == 0 && p.tile_rows >= 1 &&
         p.x != nullptr && p.delta != nullptr && p.base != nullptr;
}

template <typename T>
int Forward(const BlockConvParams& p, cudaStream_t stream) {
  ForwardKernel<T><<<Grid(p.h, p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
int Backward(const BlockConvParams& p, cudaStream_t stream) {
  GradXKernel<T><<<Grid(p.h, p.rows), kThreads, 0, stream>>>(p);
  GradDeltaKernel<T><<<Grid(p.kernel * (p.h / p.group), p.rows), kThreads, 0, stream>>>(p);
  const int64_t tiles = (p.rows + p.tile_rows - 1) / p.tile_rows;
  GradBaseKernel<T><<<Grid(p.h, tiles), kThreads, 0, stream>>>(p);
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

// Rowwise e4m3 quantization (params.h). Rows: one CTA per row, the row's max |x| by a block
// reduction, then each element divided, rounded, clamped and converted (the row is read twice,
// the second time mostly from cache; written once, at a byte per element). Columns: a first
// kernel takes each column's max |x| over 32 x 256 tiles (integer atomicMax on the float's bits,
// which order non-negative floats), a second quantizes 32 x 32 tiles and writes them transposed
// through shared memory, zeros past the last row. Where the shapes allow, the columns' two kernels
// load and store 16 bytes at a time (ColAmaxVecKernel, ColQuantVecKernel).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kernels/fp8_quant/params.h"

namespace dflash::kernels {
namespace {

constexpr int kRowThreads = 256;
constexpr float kE4m3Max = 448.f;

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
// A float rounded to the input's dtype (what LibTorch's operators on that dtype write).
__device__ __forceinline__ float Round(float v, const float*) { return v; }
__device__ __forceinline__ float Round(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

template <typename T>
__device__ __forceinline__ float ScaleOf(float amax) {
  return Round((amax > 0.f ? amax : 1.f) / kE4m3Max, static_cast<const T*>(nullptr));
}

template <typename T>
__device__ __forceinline__ __nv_fp8_storage_t Quantize(float x, float scale) {
  float v = Round(x / scale, static_cast<const T*>(nullptr));
  v = fminf(fmaxf(v, -kE4m3Max), kE4m3Max);
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    RowQuantKernel(const T* __restrict__ x, __nv_fp8_storage_t* __restrict__ q,
                   float* __restrict__ scale, int64_t cols) {
  const int64_t r = blockIdx.x;
  const T* row = x + r * cols;
  float m = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += kRowThreads) m = fmaxf(m, fabsf(Load(row + c)));
  __shared__ float warp_max[kRowThreads / 32];
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = 0.f;
  for (int w = 0; w < kRowThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  const float s = ScaleOf<T>(m);
  if (threadIdx.x == 0) scale[r] = s;
  __nv_fp8_storage_t* out = q + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kRowThreads) out[c] = Quantize<T>(Load(row + c), s);
}

constexpr int kTile = 32;
constexpr int kAmaxRows = 256;

// Block (32, 8): column c0 + tx over rows [r0, r0 + 256).
template <typename T>
__global__ void ColAmaxKernel(const T* __restrict__ x, uint32_t* __restrict__ amax, int64_t rows,
                              int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kAmaxRows;
  float m = 0.f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < min(r0 + kAmaxRows, rows); r += blockDim.y) {
      m = fmaxf(m, fabsf(Load(x + r * cols + c)));
    }
  }
  __shared__ float part[8][kTile];
  part[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int i = 1; i < 8; ++i) m = fmaxf(m, part[i][threadIdx.x]);
    atomicMax(amax + c, __float_as_uint(m));  // m >= 0: its bits order as the floats do
  }
}

// Block (32, 8): tile rows [r0, r0 + 32) x columns [c0, c0 + 32) of x, written as q^T's rows
// c0.. over columns r0.. (zeros for r >= rows); the tile's first row also writes the scales.
template <typename T>
__global__ void ColQuantKernel(const T* __restrict__ x, const uint32_t* __restrict__ amax,
                               __nv_fp8_storage_t* __restrict__ q, float* __restrict__ scale,
                               int64_t rows, int64_t cols, int64_t padded_rows) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 4];
  const int64_t c = c0 + threadIdx.x;
  const float s = c < cols ? ScaleOf<T>(__uint_as_float(amax[c])) : 1.f;
  if (blockIdx.y == 0 && threadIdx.y == 0 && c < cols) scale[c] = s;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t r = r0 + i;
    tile[i][threadIdx.x] = (r < rows && c < cols) ? Quantize<T>(Load(x + r * cols + c), s)
                                                  : static_cast<__nv_fp8_storage_t>(0);
  }
  __syncthreads();
  // q^T row c0 + i, columns r0 + tx.
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t qc = c0 + i, qr = r0 + threadIdx.x;
    if (qc < cols && qr < padded_rows) q[qc * padded_rows + qr] = tile[threadIdx.x][i];
  }
}

// The columns' kernels with 16-byte loads and stores (kVec elements of T per load), taken when
// every row starts 16-byte aligned (cols a multiple of kVec), x and q are 16-byte aligned and
// padded_rows is a multiple of 16; the same arithmetic as the kernels above (Quantize, ScaleOf),
// so the same bytes. Each warp reads 512 contiguous bytes of a row (the kernels above: 64 or 128
// bytes as 2- or 4-byte loads) and each output row of q^T is written 16 bytes at a time.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
struct alignas(16) Vec {
  T v[kVec<T>];
};

// Block 256 = 8 warps: warp w takes rows r0 + w, r0 + w + 8, ... of [r0, r0 + kAmaxRows), lane l
// the kVec columns c0 + l kVec ..; the 8 warps' maxima meet in shared memory, one atomicMax per
// column.
template <typename T>
__global__ void __launch_bounds__(256)
    ColAmaxVecKernel(const T* __restrict__ x, uint32_t* __restrict__ amax, int64_t rows,
                     int64_t cols) {
  constexpr int V = kVec<T>, kCols = 32 * V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + lane * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kAmaxRows;
  const int64_t r1 = min(r0 + kAmaxRows, rows);
  float m[V];
#pragma unroll
  for (int k = 0; k < V; ++k) m[k] = 0.f;
  if (c < cols) {
    for (int64_t r = r0 + warp; r < r1; r += 8) {
      const Vec<T> v = *reinterpret_cast<const Vec<T>*>(x + r * cols + c);
#pragma unroll
      for (int k = 0; k < V; ++k) m[k] = fmaxf(m[k], fabsf(Load(&v.v[k])));
    }
  }
  __shared__ float part[8][kCols];
#pragma unroll
  for (int k = 0; k < V; ++k) part[warp][lane * V + k] = m[k];
  __syncthreads();
  for (int i = threadIdx.x; i < kCols; i += 256) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + i;
    if (col >= cols) continue;
    float t = part[0][i];
    for (int w = 1; w < 8; ++w) t = fmaxf(t, part[w][i]);
    atomicMax(amax + col, __float_as_uint(t));  // t >= 0: its bits order as the floats do
  }
}

// Block 256: a tile of 64 rows x 64 columns of x. Each thread loads kVec consecutive columns of
// a row (16 bytes), quantizes them with their columns' scales and puts the bytes transposed in
// shared memory (row stride 68 bytes: at most 2-way bank conflicts); then each thread writes 16
// bytes of one of the tile's 64 rows of q^T (zeros for rows r >= rows).
template <typename T>
__global__ void __launch_bounds__(256)
    ColQuantVecKernel(const T* __restrict__ x, const uint32_t* __restrict__ amax,
                      __nv_fp8_storage_t* __restrict__ q, float* __restrict__ scale, int64_t rows,
                      int64_t cols, int64_t padded_rows) {
  constexpr int V = kVec<T>, kGroups = 64 / V, kRowsPerPass = 256 / kGroups, kStride = 68;
  __shared__ __align__(16) __nv_fp8_storage_t tile[64 * kStride];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 64;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 64;
  const int group = threadIdx.x % kGroups, rr = threadIdx.x / kGroups;
  const int64_t c = c0 + group * V;
  const bool col_ok = c < cols;  // cols is a multiple of V: the whole group is in or out
  float s[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    s[k] = col_ok ? ScaleOf<T>(__uint_as_float(amax[c + k])) : 1.f;
    if (blockIdx.y == 0 && rr == 0 && col_ok) scale[c + k] = s[k];
  }
  for (int i = rr; i < 64; i += kRowsPerPass) {
    const int64_t r = r0 + i;
    if (col_ok && r < rows) {
      const Vec<T> v = *reinterpret_cast<const Vec<T>*>(x + r * cols + c);
#pragma unroll
      for (int k = 0; k < V; ++k)
        tile[(group * V + k) * kStride + i] = Quantize<T>(Load(&v.v[k]), s[k]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) tile[(group * V + k) * kStride + i] = 0;
    }
  }
  __syncthreads();
  const int oc = threadIdx.x >> 2, j = threadIdx.x & 3;  // q^T row c0 + oc, bytes 16 j ..
  const int64_t qr = r0 + 16 * j;
  if (c0 + oc < cols && qr < padded_rows) {  // padded_rows % 16 == 0: all 16 bytes or none
    const uint32_t* w = reinterpret_cast<const uint32_t*>(tile + oc * kStride + 16 * j);
    *reinterpret_cast<uint4*>(q + (c0 + oc) * padded_rows + qr) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename T>
int Launch(const Fp8QuantParams& p, cudaStream_t stream) {
  const T* x = static_cast<const T*>(p.x);
  auto* q = static_cast<__nv_fp8_storage_t*>(p.q);
  if (!p.columns) {
    if (p.rows > 0)
      RowQuantKernel<T>
          <<<static_cast<unsigned>(p.rows), kRowThreads, 0, stream>>>(x, q, p.scale, p.cols);
    return static_cast<int>(cudaGetLastError());
  }
  if (p.cols % kVec<T> == 0 && p.padded_rows % 16 == 0 && Aligned16(p.x) && Aligned16(p.q)) {
    if (p.rows > 0) {
      const dim3 grid(static_cast<unsigned>((p.cols + 32 * kVec<T> - 1) / (32 * kVec<T>)),
                      static_cast<unsigned>((p.rows + kAmaxRows - 1) / kAmaxRows));
      ColAmaxVecKernel<T><<<grid, 256, 0, stream>>>(x, p.amax, p.rows, p.cols);
    }
    const dim3 grid(static_cast<unsigned>((p.cols + 63) / 64),
                    static_cast<unsigned>((p.padded_rows + 63) / 64));
    ColQuantVecKernel<T>
        <<<grid, 256, 0, stream>>>(x, p.amax, q, p.scale, p.rows, p.cols, p.padded_rows);
    return static_cast<int>(cudaGetLastError());
  }
  const dim3 block(kTile, 8);
  const unsigned col_tiles = static_cast<unsigned>((p.cols + kTile - 1) / kTile);
  if (p.rows > 0) {
    const dim3 grid(col_tiles, static_cast<unsigned>((p.rows + kAmaxRows - 1) / kAmaxRows));
    ColAmaxKernel<T><<<grid, block, 0, stream>>>(x, p.amax, p.rows, p.cols);
  }
  const dim3 grid(col_tiles, static_cast<unsigned>((p.padded_rows + kTile - 1) / kTile));
  ColQuantKernel<T>
      <<<grid, block, 0, stream>>>(x, p.amax, q, p.scale, p.rows, p.cols, p.padded_rows);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchFp8Quant(const Fp8QuantParams& p, void* stream) {
  if (p.cols == 0 || (p.columns ? p.padded_rows == 0 : p.rows == 0)) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  return p.dtype == Fp8QuantDType::kBFloat16 ? Launch<__nv_bfloat16>(p, s) : Launch<float>(p, s);
}

}  // namespace dflash::kernels

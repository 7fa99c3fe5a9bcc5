// One CTA per (value-column tile of 32, head, document) carries that slice of the state S [DK, 32]
// in shared memory through the document's chunks, in fp32 on the CUDA cores. Per chunk:
//   v_new = U - W S          (the part of the chunk's writes the state does not predict)
//   out   = Q S + A v_new    (the state read by the chunk's queries + the chunk's own attention)
//   S     = decay * S + K^T v_new
// W, Q and K are staged one after the other in one shared buffer [C, DK]; A [C, C] and v_new
// [C, 32] beside it. Thread t owns column t % 32 and rows 8 (t / 32) .. +7 of the chunk's outputs,
// and rows DK/8 (t / 32) .. of its state column.
#include <cuda_runtime.h>

#include "common/kernels/gated_delta/convert.cuh"
#include "common/kernels/gated_delta/params.h"

namespace dflash::kernels {
namespace {

constexpr int C = kScanChunk, COLS = kScanColumns, THREADS = kScanThreads;
constexpr int ROWS = C / (THREADS / COLS);  // chunk rows per thread: 8

// Copies n floats (a multiple of 4, 16-byte aligned) from global to shared memory.
__device__ __forceinline__ void Stage(float* dst, const float* src, int n) {
  const float4* s = reinterpret_cast<const float4*>(src);
  float4* d = reinterpret_cast<float4*>(dst);
  for (int i = threadIdx.x; i < n / 4; i += THREADS) d[i] = s[i];
}

template <int DK, typename T>
__global__ void __launch_bounds__(THREADS) GatedDeltaScanKernel(GatedDeltaScanParams p) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* buf = smem;               // [C, DK]: W, then Q, then K
  float* a = buf + C * DK;         // [C, C]
  float* vnew = a + C * C;         // [C, COLS]
  float* state = vnew + C * COLS;  // [DK, COLS]
  const int col0 = blockIdx.x * COLS, head = blockIdx.y, doc = blockIdx.z;
  const int c = threadIdx.x % COLS, g = threadIdx.x / COLS;
  const int64_t dv = p.dv, heads = p.heads;
  T* out = static_cast<T*>(p.out);
  for (int i = threadIdx.x; i < DK * COLS; i += THREADS) state[i] = 0.f;

  for (int64_t j = 0; j < p.num_steps; ++j) {
    if (doc >= p.steps[2 * j + 1]) break;  // documents are sorted: no later chunk either
    const int64_t chunk = p.steps[2 * j] + doc, chunk_head = chunk * heads + head;
    const int32_t* rows = p.rows + chunk * C;
    const float* u = p.u + chunk_head * C * dv + col0;

    // v_new = U - W S
    __syncthreads();  // the previous step's reads of buf and vnew are done
    Stage(buf, p.w + chunk_head * C * DK, C * DK);
    __syncthreads();
    float acc[ROWS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) acc[i] = u[(g * ROWS + i) * dv + c];
    for (int k = 0; k < DK; k += 4) {
      const float s0 = state[(k + 0) * COLS + c], s1 = state[(k + 1) * COLS + c];
      const float s2 = state[(k + 2) * COLS + c], s3 = state[(k + 3) * COLS + c];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const float4 w = *reinterpret_cast<const float4*>(&buf[(g * ROWS + i) * DK + k]);
        acc[i] -= w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
      }
    }
#pragma unroll
    for (int i = 0; i < ROWS; ++i) vnew[(g * ROWS + i) * COLS + c] = acc[i];
    __syncthreads();

    // out = Q S + A v_new
    Stage(buf, p.q + chunk_head * C * DK, C * DK);
    Stage(a, p.a + chunk_head * C * C, C * C);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ROWS; ++i) acc[i] = 0.f;
    for (int k = 0; k < DK; k += 4) {
      const float s0 = state[(k + 0) * COLS + c], s1 = state[(k + 1) * COLS + c];
      const float s2 = state[(k + 2) * COLS + c], s3 = state[(k + 3) * COLS + c];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const float4 q = *reinterpret_cast<const float4*>(&buf[(g * ROWS + i) * DK + k]);
        acc[i] += q.x * s0 + q.y * s1 + q.z * s2 + q.w * s3;
      }
    }
    for (int m = 0; m < C; m += 4) {
      const float v0 = vnew[(m + 0) * COLS + c], v1 = vnew[(m + 1) * COLS + c];
      const float v2 = vnew[(m + 2) * COLS + c], v3 = vnew[(m + 3) * COLS + c];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const float4 x = *reinterpret_cast<const float4*>(&a[(g * ROWS + i) * C + m]);
        acc[i] += x.x * v0 + x.y * v1 + x.z * v2 + x.w * v3;
      }
    }
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int row = rows[g * ROWS + i];  // padding rows (-1) are not written
      if (row >= 0) out[(row * heads + head) * dv + col0 + c] = gdr::FromFloat<T>(acc[i]);
    }
    __syncthreads();  // every read of the state and of buf (Q) is done

    // S = decay * S + K^T v_new; this thread's state rows kr .. kr + DK/8 - 1 of column c.
    Stage(buf, p.k + chunk_head * C * DK, C * DK);
    __syncthreads();
    constexpr int KR = DK / (THREADS / COLS);
    const int kr = g * KR;
    float s[KR];
#pragma unroll
    for (int i = 0; i < KR; ++i) s[i] = 0.f;
    for (int r = 0; r < C; ++r) {
      const float v = vnew[r * COLS + c];
#pragma unroll
      for (int i = 0; i < KR; i += 4) {
        const float4 kk = *reinterpret_cast<const float4*>(&buf[r * DK + kr + i]);
        s[i + 0] += kk.x * v;
        s[i + 1] += kk.y * v;
        s[i + 2] += kk.z * v;
        s[i + 3] += kk.w * v;
      }
    }
    const float d = p.decay[chunk_head];
#pragma unroll
    for (int i = 0; i < KR; ++i) state[(kr + i) * COLS + c] = d * state[(kr + i) * COLS + c] + s[i];
  }
}

template <int DK, typename T>
int Launch(const GatedDeltaScanParams& p, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (C * DK + C * C + C * COLS + DK * COLS);
  cudaError_t e =
      cudaFuncSetAttribute(GatedDeltaScanKernel<DK, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e != cudaSuccess) return static_cast<int>(e);
  const dim3 grid(static_cast<unsigned>(p.dv / COLS), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.documents));
  GatedDeltaScanKernel<DK, T><<<grid, THREADS, smem, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchGatedDeltaScan(const GatedDeltaScanParams& p, void* stream) {
  if (p.documents == 0 || p.num_steps == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  return gdr::DispatchDkAndDtype(p.dk, p.dtype, [&](auto dk, auto element) {
    return Launch<decltype(dk)::value, decltype(element)>(p, s);
  });
}

}  // namespace dflash::kernels

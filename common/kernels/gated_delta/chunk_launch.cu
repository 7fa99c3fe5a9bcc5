// The intra-chunk phase of the chunked gated delta rule, one CTA per (chunk, head), fp32 on the
// CUDA cores. With cum = the inclusive cumulative sum of the chunk's log decays g:
//   a[i][j] = (q_i . k_j) exp(cum_i - cum_j) for j <= i, else 0        (the chunk's attention)
//   L[i][j] = beta_i (k_i . k_j) exp(cum_i - cum_j) for j < i, else 0   (the UT system)
//   (I + L) [u | w] = [beta v | beta exp(cum) k]                        (forward substitution)
//   q_out = exp(cum) q,  k_out = exp(cum_last - cum) k,  decay = exp(cum_last)
// the same quantities as the ATen path of nn::GatedDeltaRuleChunked (transformers'
// torch_chunk_gated_delta_rule). The chunk's rows are gathered from the packed tensors (params.h)
// and L2-normalized here (q also scaled by DK^-0.5), in fp32. Q and K sit in shared memory with
// rows padded by 4 floats (16-byte aligned, rows 4 banks apart); L beside them. Thread t computes
// the 16 entries (i, j), i = t / 4, j = t % 4 + 4m of the two 64 x 64 products; for the solve each
// thread owns right-hand side columns and keeps its column of the solution in registers.
#include <cuda_runtime.h>

#include "common/kernels/gated_delta/convert.cuh"
#include "common/kernels/gated_delta/params.h"

namespace dflash::kernels {
namespace {

constexpr int C = kScanChunk, THREADS = kScanThreads;

using gdr::ToFloat;

template <int DK, typename T>
__global__ void __launch_bounds__(THREADS) GatedDeltaChunkKernel(GatedDeltaChunkParams p) {
  constexpr int KP = DK + 4;  // padded row
  extern __shared__ float4 smem4[];
  float* s_q = reinterpret_cast<float*>(smem4);      // [C][KP]
  float* s_k = s_q + C * KP;                         // [C][KP]
  float* s_l = s_k + C * KP;                         // [C][C]
  float* s_cum = s_l + C * C;                        // [C]
  float* s_beta = s_cum + C;                         // [C]
  int* s_rows = reinterpret_cast<int*>(s_beta + C);  // [C]
  const int64_t heads = p.heads, head = blockIdx.y;
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * heads + head;
  const int64_t dv = p.dv;
  const int tid = threadIdx.x;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  if (tid < C) {
    const int row = p.rows[static_cast<int64_t>(blockIdx.x) * C + tid];
    s_rows[tid] = row;
    s_cum[tid] = row >= 0 ? p.g[row * heads + head] : 0.f;
    s_beta[tid] = row >= 0 ? ToFloat(static_cast<const T*>(p.beta)[row * heads + head]) : 0.f;
  }
  __syncthreads();
  for (int e = tid; e < C * DK; e += THREADS) {
    const int r = e / DK, c = e % DK, row = s_rows[r];
    const int64_t at = (row * heads + head) * DK + c;
    s_q[r * KP + c] = row >= 0 ? ToFloat(q[at]) : 0.f;
    s_k[r * KP + c] = row >= 0 ? ToFloat(k[at]) : 0.f;
  }
  __syncthreads();
  {
    // L2 norms (transformers' l2norm, eps 1e-6): four neighbouring threads per row.
    const int r = tid / 4, part = tid % 4;
    float sq = 0.f, sk = 0.f;
    for (int c = part * (DK / 4); c < (part + 1) * (DK / 4); ++c) {
      sq += s_q[r * KP + c] * s_q[r * KP + c];
      sk += s_k[r * KP + c] * s_k[r * KP + c];
    }
    sq += __shfl_xor_sync(0xffffffffu, sq, 1);
    sq += __shfl_xor_sync(0xffffffffu, sq, 2);
    sk += __shfl_xor_sync(0xffffffffu, sk, 1);
    sk += __shfl_xor_sync(0xffffffffu, sk, 2);
    const float qs = rsqrtf(sq + 1e-6f) * rsqrtf(static_cast<float>(DK));
    const float ks = rsqrtf(sk + 1e-6f);
    for (int c = part * (DK / 4); c < (part + 1) * (DK / 4); ++c) {
      s_q[r * KP + c] *= qs;
      s_k[r * KP + c] *= ks;
    }
    if (tid == 0) {
      for (int i = 1; i < C; ++i) s_cum[i] += s_cum[i - 1];
    }
  }
  __syncthreads();

  // The two products: row i, columns j = tid % 4 + 4m.
  const int i = tid / 4, j0 = tid % 4;
  float qk[16], kk[16];
#pragma unroll
  for (int m = 0; m < 16; ++m) qk[m] = kk[m] = 0.f;
  for (int d = 0; d < DK; d += 4) {
    const float4 qi = *reinterpret_cast<const float4*>(&s_q[i * KP + d]);
    const float4 ki = *reinterpret_cast<const float4*>(&s_k[i * KP + d]);
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      const float4 kj = *reinterpret_cast<const float4*>(&s_k[(j0 + 4 * m) * KP + d]);
      qk[m] += qi.x * kj.x + qi.y * kj.y + qi.z * kj.z + qi.w * kj.w;
      kk[m] += ki.x * kj.x + ki.y * kj.y + ki.z * kj.z + ki.w * kj.w;
    }
  }
  float* a = p.a + ch * C * C;
  const float cum_i = s_cum[i], beta_i = s_beta[i];
#pragma unroll
  for (int m = 0; m < 16; ++m) {
    const int j = j0 + 4 * m;
    const float decay = j <= i ? __expf(cum_i - s_cum[j]) : 0.f;
    a[i * C + j] = qk[m] * decay;
    s_l[i * C + j] = j < i ? beta_i * kk[m] * decay : 0.f;
  }
  __syncthreads();

  // Forward substitution, one right-hand-side column per thread at a time: columns 0 .. dv-1 are
  // beta v (-> u), dv .. dv+DK-1 are beta exp(cum) k (-> w).
  for (int col = tid; col < dv + DK; col += THREADS) {
    const bool is_v = col < dv;
    float* out = is_v ? p.u + ch * C * dv + col : p.w + ch * C * DK + (col - dv);
    const int64_t stride = is_v ? dv : DK;
    float x[C];
#pragma unroll
    for (int r = 0; r < C; ++r) {
      const int row = s_rows[r];
      float acc = !is_v      ? s_k[r * KP + (col - dv)] * s_beta[r] * __expf(s_cum[r])
                  : row >= 0 ? ToFloat(v[(row * heads + head) * dv + col]) * s_beta[r]
                             : 0.f;
#pragma unroll
      for (int c = 0; c < r; ++c) acc -= s_l[r * C + c] * x[c];
      x[r] = acc;
      out[r * stride] = acc;
    }
  }

  // Decayed queries and keys, the chunk's decay.
  const float last = s_cum[C - 1];
  float* q_out = p.q_out + ch * C * DK;
  float* k_out = p.k_out + ch * C * DK;
  for (int e = tid; e < C * DK; e += THREADS) {
    const int r = e / DK, c = e % DK;
    q_out[e] = s_q[r * KP + c] * __expf(s_cum[r]);
    k_out[e] = s_k[r * KP + c] * __expf(last - s_cum[r]);
  }
  if (tid == 0) p.decay[ch] = __expf(last);
}

template <int DK, typename T>
int Launch(const GatedDeltaChunkParams& p, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (2 * C * (DK + 4) + C * C + 3 * C);
  cudaError_t e =
      cudaFuncSetAttribute(GatedDeltaChunkKernel<DK, T>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return static_cast<int>(e);
  const dim3 grid(static_cast<unsigned>(p.chunks), static_cast<unsigned>(p.heads));
  GatedDeltaChunkKernel<DK, T><<<grid, THREADS, smem, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchGatedDeltaChunk(const GatedDeltaChunkParams& p, void* stream) {
  if (p.chunks == 0 || p.heads == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  return gdr::DispatchDkAndDtype(p.dk, p.dtype, [&](auto dk, auto element) {
    return Launch<decltype(dk)::value, decltype(element)>(p, s);
  });
}

}  // namespace dflash::kernels

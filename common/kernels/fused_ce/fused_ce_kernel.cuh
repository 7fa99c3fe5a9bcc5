// Device code of the fused cross-entropy: one CTA per logits row.
//   pass 1: online max / sum of exp (fp32) and the first argmax, reduced over the CTA;
//   pass 2: the row is overwritten with w * (exp(z - lse) - [j == label]).
// The row is read twice and written once: 3 * V * sizeof(T) bytes of traffic per row, against the
// 2 * V * H FLOPs of each of the two GEMMs around it (H = 4096: the passes cost ~5% of the GEMMs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>

#include "common/kernels/float_convert.cuh"
#include "common/kernels/fused_ce/params.h"

namespace dflash::kernels {

constexpr int kCeThreads = 512;

// Running state of one thread (then of the CTA): max m, sum of exp(z - m), and the first argmax.
struct RowState {
  float m;
  float s;
  float best;
  int64_t best_index;
};

__device__ __forceinline__ RowState Combine(RowState a, RowState b) {
  RowState r;
  r.m = fmaxf(a.m, b.m);
  // exp(-inf - -inf) would be NaN: a side that saw nothing contributes nothing.
  const float sa = a.m == -CUDART_INF_F ? 0.f : a.s * __expf(a.m - r.m);
  const float sb = b.m == -CUDART_INF_F ? 0.f : b.s * __expf(b.m - r.m);
  r.s = sa + sb;
  // First maximum, as at::argmax: the larger value, and on a tie the smaller index.
  if (b.best > a.best || (b.best == a.best && b.best_index < a.best_index)) {
    r.best = b.best;
    r.best_index = b.best_index;
  } else {
    r.best = a.best;
    r.best_index = a.best_index;
  }
  return r;
}

__device__ __forceinline__ RowState ShuffleDown(RowState v, int offset) {
  RowState o;
  o.m = __shfl_down_sync(0xffffffffu, v.m, offset);
  o.s = __shfl_down_sync(0xffffffffu, v.s, offset);
  o.best = __shfl_down_sync(0xffffffffu, v.best, offset);
  o.best_index = __shfl_down_sync(0xffffffffu, v.best_index, offset);
  return o;
}

// Reduces over the CTA; every thread returns the CTA's state.
__device__ RowState BlockReduce(RowState v) {
  __shared__ RowState warp_states[kCeThreads / 32];
  __shared__ RowState result;
  for (int offset = 16; offset > 0; offset >>= 1) v = Combine(v, ShuffleDown(v, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_states[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kCeThreads / 32 ? warp_states[lane]
                               : RowState{-CUDART_INF_F, 0.f, -CUDART_INF_F, INT64_MAX};
    for (int offset = 16; offset > 0; offset >>= 1) v = Combine(v, ShuffleDown(v, offset));
    if (lane == 0) result = v;
  }
  __syncthreads();
  return result;
}

template <typename T>
__global__ void __launch_bounds__(kCeThreads) FusedCeRowsKernel(FusedCeParams p) {
  const int64_t row = blockIdx.x;
  T* z = static_cast<T*>(p.logits) + row * p.ld;
  RowState st{-CUDART_INF_F, 0.f, -CUDART_INF_F, INT64_MAX};
  for (int64_t j = threadIdx.x; j < p.vocab; j += kCeThreads) {
    const float x = ToFloat(z[j]);
    if (x == -CUDART_INF_F) continue;  // contributes exp(-inf) = 0, and must not make a NaN
    if (x > st.m) {
      st.s = (st.m == -CUDART_INF_F ? 0.f : st.s * __expf(st.m - x)) + 1.f;
      st.m = x;
    } else {
      st.s += __expf(x - st.m);
    }
    // Indices grow along a thread's loop, so ">" keeps the first maximum.
    if (x > st.best) {
      st.best = x;
      st.best_index = j;
    }
  }
  st = BlockReduce(st);
  const float lse = st.m + __logf(st.s);
  const int64_t label = p.labels[row];
  const float w = p.weights[row];
  if (threadIdx.x == 0) {
    p.loss[row] = lse - ToFloat(z[label]);
    p.correct[row] = st.best_index == label;
  }
  // Every thread has read z[label] above (thread 0) before anyone overwrites it: the reduction's
  // __syncthreads orders pass 1 before pass 2, and this one orders thread 0's read.
  __syncthreads();
  for (int64_t j = threadIdx.x; j < p.vocab; j += kCeThreads) {
    const float prob = __expf(ToFloat(z[j]) - lse);
    z[j] = FromFloat<T>(w * (prob - (j == label ? 1.f : 0.f)));
  }
}

}  // namespace dflash::kernels

// Backward of the fused DFlash attention on Hopper (sm_90a): the work split of bwd_kernel.cuh (one
// CTA = one warpgroup per (key tile, kv head), visiting every query tile that sees the keys), with
// the five products of a visit issued as warpgroup MMAs (wgmma.cuh) on swizzled shared-memory
// tiles instead of per-warp mma.sync fed by ldmatrix:
//   S^T  = K Q^T        A = K (smem, K-major),         B = Q (smem, K-major)
//   dP^T = V dO^T       A = V (smem, K-major),         B = dO (smem, K-major)
//   dV  += P^T dO       A = P^T (registers),           B = dO (smem, MN-major)
//   dK  += dS^T Q       A = dS^T (registers),          B = Q (smem, MN-major)
//   dQ   = dS K         A = dS^T tile (smem, MN-major), B = K (smem, MN-major), fp32 atomics
// Warp w holds keys 16w..16w+15 of S^T, dP^T, dK and dV and query rows 16w..16w+15 of dQ, in the
// mma.sync fragment layout, so the softmax, masking and atomics are those of bwd_kernel.cuh.
//
// Head dim 256: dK and dV of 64 keys x 256 columns would take 256 accumulator registers per thread,
// so the columns are split in halves of 128 (blockIdx.z): both CTAs of a key tile compute the full
// S^T and dP^T (their contraction runs over all 256 columns) and each accumulates its half of dK,
// dV and dQ. 1.4x the tensor work of one pass, at one CTA per SM (the four tiles take 200 KiB).
#pragma once

#include <math_constants.h>

#include "common/kernels/dflash_attn/params.h"
#include "common/kernels/dflash_attn/tile_common.cuh"
#include "common/kernels/dflash_attn/wgmma.cuh"

namespace dflash::kernels::attn {

// Columns of dK, dV and dQ that one CTA accumulates (blockIdx.z selects which).
template <int D>
__host__ __device__ constexpr int BwdSm90Cols() {
  return D < 128 ? D : 128;
}

template <int D>
constexpr int BwdSm90SmemBytes() {
  // K, V, 2 x (Q, dO) of 64 x D, dS^T of 64 x 64 (bf16); 2 x (lse, delta) of 64 rows; 1 KiB so
  // that the tiles can start 1024-byte aligned.
  return (6 * 64 * D + 64 * 64) * 2 + 4 * 64 * 4 + 1024;
}

// dV or dK (+)= A B over the 64 query rows of a visit: A the packed bf16 fragments of P^T or dS^T
// (k-step jj = rows 16jj..16jj+15), B the swizzled Q or dO tile read MN-major.
template <int N>
__device__ __forceinline__ void AccumulateRS(float (&acc)[N / 8][4], const uint32_t (&a)[4][4],
                                             const bf16* tile) {
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    if constexpr (N == 128) {
      WgmmaRS_N128<1>(acc, a[jj], DescMn(tile, jj), 1);
    } else {
      WgmmaRS_N64<1>(acc, a[jj], DescMn(tile, jj), 1);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(128, D <= 128 ? 2 : 1)
    DflashAttnBwdSm90Kernel(const DflashAttnBwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kSteps = D / 16, kTile = 64 * D;
  constexpr int kCols = BwdSm90Cols<D>(), kPanels = kCols / 64;
  const int col0 = blockIdx.z * kCols;  // this CTA's columns of dK, dV and dQ
  const int panel0 = col0 / 64;
  extern __shared__ unsigned char smem_raw[];
  bf16* s_k = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                      ~static_cast<uintptr_t>(1023));
  bf16* s_v = s_k + kTile;
  bf16* s_q = s_v + kTile;                                  // 2 buffers
  bf16* s_do = s_q + 2 * kTile;                             // 2 buffers
  bf16* s_ds = s_do + 2 * kTile;                            // dS^T: [64 keys][64 rows], one panel
  float* s_lse = reinterpret_cast<float*>(s_ds + 64 * 64);  // 2 x 64
  float* s_delta = s_lse + 2 * 64;                          // 2 x 64

  const AttnBwdItem it = p.items[blockIdx.x];
  const int g = blockIdx.y;
  const int group = p.hq / p.hkv;
  const GroupRows gr(group);  // tile row -> (position, head)
  const int pos_per_tile = 64 / group;
  const int q_tiles_per_anchor = (p.block_size + pos_per_tile - 1) / pos_per_tile;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  const bf16* dout = static_cast<const bf16*>(p.dout);
  const int64_t q_row_stride = static_cast<int64_t>(p.hq) * D;
  const int64_t kv_row_stride = static_cast<int64_t>(p.hkv) * D;

  {
    const bf16* kb = k + it.key_row * kv_row_stride + g * D;
    const bf16* vb = v + it.key_row * kv_row_stride + g * D;
    LoadTileSw128<D>(
        s_k, it.n_keys, [&](int r) { return kb + r * kv_row_stride; }, k, tid);
    LoadTileSw128<D>(
        s_v, it.n_keys, [&](int r) { return vb + r * kv_row_stride; }, v, tid);
  }

  const int n_visits = (it.j_end - it.j_begin) * q_tiles_per_anchor;
  auto visit_pos = [&](int u, int* n_pos) {
    const int j = it.j_begin + u / q_tiles_per_anchor, pt = u % q_tiles_per_anchor;
    *n_pos = min(pos_per_tile, p.block_size - pt * pos_per_tile);
    return j * p.block_size + pt * pos_per_tile;
  };
  auto load_q = [&](int u, int buf) {
    int n_pos;
    const int pos = visit_pos(u, &n_pos);
    const int64_t base = pos * q_row_stride + static_cast<int64_t>(g) * group * D;
    auto row_off = [&](int r) { return gr.pos(r) * q_row_stride + gr.head(r) * D; };
    LoadTileSw128<D>(
        s_q + buf * kTile, n_pos * group, [&](int r) { return q + base + row_off(r); }, q, tid);
    LoadTileSw128<D>(
        s_do + buf * kTile, n_pos * group, [&](int r) { return dout + base + row_off(r); }, dout,
        tid);
    if (tid < 64) {
      const bool valid = gr.pos(tid) < n_pos;
      const int64_t idx = static_cast<int64_t>(pos + gr.pos(tid)) * p.hq + g * group + gr.head(tid);
      s_lse[buf * 64 + tid] = valid ? p.lse[idx] : CUDART_INF_F;
      s_delta[buf * 64 + tid] = valid ? p.delta[idx] : 0.f;
    }
  };
  if (n_visits > 0) load_q(0, 0);
  CpAsyncCommit();

  float dk_acc[kCols / 8][4], dv_acc[kCols / 8][4];
#pragma unroll
  for (int i = 0; i < kCols / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.f;
  }
  const int key0 = warp * 16 + (lane >> 2);  // this thread's keys in the tile: key0, key0 + 8

  for (int u = 0; u < n_visits; ++u) {
    const int j = it.j_begin + u / q_tiles_per_anchor;
    const int anchor = p.anchors[j];
    if (u + 1 < n_visits) {
      load_q(u + 1, (u + 1) & 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    FenceProxyAsync();
    __syncthreads();
    const int buf = u & 1;
    const bf16* qt = s_q + buf * kTile;
    const bf16* dot = s_do + buf * kTile;
    const float* lse = s_lse + buf * 64;
    const float* delta = s_delta + buf * 64;
    int n_pos;
    const int pos = visit_pos(u, &n_pos);
    // A padding anchor inside a document's range sees nothing: skip (uniform over the CTA).
    if (anchor >= 0) {
      // S^T = K Q^T and dP^T = V dO^T [64 keys x 64 rows], issued together.
      float s_acc[8][4], dp_acc[8][4];
      WgmmaFence();
#pragma unroll
      for (int s = 0; s < kSteps; ++s) WgmmaSS_N64<0, 0>(s_acc, DescK(s_k, s), DescK(qt, s), s > 0);
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        WgmmaSS_N64<0, 0>(dp_acc, DescK(s_v, s), DescK(dot, s), s > 0);
      }
      WgmmaCommit();
      WgmmaWait<0>();
      FenceRegs(s_acc);
      FenceRegs(dp_acc);
      // P^T = exp2(S^T * scale_log2 - lse) on the visible keys, dS^T = P^T (dP^T - delta), both
      // packed as the register A operand (k-step jj = query rows 16jj..16jj+15).
      const int limit = it.masked ? min(it.n_keys, anchor - it.key_row) : it.n_keys;
      const bool key_ok[2] = {key0 < limit, key0 + 8 < limit};
      const int slot_base = pos - j * p.block_size;
      const SlotBounds sb = VisitSlotBounds(p, it, anchor, key0, slot_base, n_pos);
      uint32_t a_p[4][4], a_ds[4][4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        ProbsT(s_acc, jj, lse, key_ok, sb, gr, slot_base, p.scale_log2, lane);
        PackA(s_acc, jj, a_p[jj]);
        GradScoresT(s_acc, jj, dp_acc, delta, lane);
        PackA(s_acc, jj, a_ds[jj]);
        // dS^T to shared memory for dQ: rows key0 and key0 + 8, query columns jj*16 + ....
        const int col = jj * 16 + (lane & 3) * 2;
        *reinterpret_cast<uint32_t*>(s_ds + Sw128(key0, col)) = a_ds[jj][0];
        *reinterpret_cast<uint32_t*>(s_ds + Sw128(key0 + 8, col)) = a_ds[jj][1];
        *reinterpret_cast<uint32_t*>(s_ds + Sw128(key0, col + 8)) = a_ds[jj][2];
        *reinterpret_cast<uint32_t*>(s_ds + Sw128(key0 + 8, col + 8)) = a_ds[jj][3];
      }
      // dV += P^T dO, dK += dS^T Q: the K^T-side accumulators stay in registers for the item.
      WgmmaFence();
      AccumulateRS<kCols>(dv_acc, a_p, dot + panel0 * 64 * 64);
      AccumulateRS<kCols>(dk_acc, a_ds, qt + panel0 * 64 * 64);
      WgmmaCommit();
      FenceProxyAsync();
      __syncthreads();  // dS^T complete in shared memory
      // dQ rows 16w..16w+15 += dS K, 64 columns (one panel of K) at a time, into fp32 atomics.
      const int r = warp * 16 + (lane >> 2) + ((lane & 1) ? 8 : 0);  // AtomicAddRows' row
      float* row =
          p.dq_accum + (static_cast<int64_t>(pos + gr.pos(r)) * p.hq + g * group + gr.head(r)) * D;
#pragma unroll
      for (int panel = panel0; panel < panel0 + kPanels; ++panel) {
        float acc[8][4];
        WgmmaFence();  // acc was read by the previous panel's atomics
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          WgmmaSS_N64<1, 1>(acc, DescMn(s_ds, kk), DescMn(s_k + panel * 64 * 64, kk), kk > 0);
        }
        WgmmaCommit();
        WgmmaWait<0>();
        FenceRegs(acc);
        AtomicAddRows(acc, row, panel * 64, lane, gr.pos(r) < n_pos);
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        FenceRegs(a_p[jj]);
        FenceRegs(a_ds[jj]);
      }
      FenceRegs(dv_acc);
      FenceRegs(dk_acc);
    }
    __syncthreads();  // s_ds and this visit's buffers are rewritten next
  }
  CpAsyncWait<0>();

  WriteKeyRows(p, it, g, col0, key0, lane, dk_acc, dv_acc);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace dflash::kernels::attn

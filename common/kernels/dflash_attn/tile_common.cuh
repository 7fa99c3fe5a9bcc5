// Per-thread pieces shared by the two kernel families (mma.sync: fwd_kernel.cuh / bwd_kernel.cuh;
// wgmma: fwd_kernel_sm90.cuh / bwd_kernel_sm90.cuh). Both hold the same fragment layout (mma.cuh):
// thread `lane` of warp w owns rows 16w + lane/4 and +8 of a 64-row tile, at columns
// 8i + 2(lane%4) + {0,1} of n-tile i.
#pragma once

#include <math_constants.h>

#include <climits>

#include "common/kernels/dflash_attn/mma.cuh"
#include "common/kernels/dflash_attn/params.h"

namespace dflash::kernels::attn {

// Tile row r of a kv group of G query heads (params.h) -> position r / G and head r % G, by a
// multiply and a shift instead of a division: exact for r < 128 and G <= 64 (checked for every
// pair); for a power of two it costs one multiply more than a shift and a mask.
struct GroupRows {
  int group, magic;
  __device__ explicit GroupRows(int g) : group(g), magic((65536 + g - 1) / g) {}
  __device__ __forceinline__ int pos(int r) const { return (r * magic) >> 16; }
  __device__ __forceinline__ int head(int r) const { return r - pos(r) * group; }
};

// The keys a forward tile shows this thread's rows (r0 and r0 + 8): key base + col is visible to
// row h when col < klen and lo[h] <= base + col <= hi[h]; `mask` says whether any key of the tile
// can be hidden (otherwise the softmax skips the test).
struct TileBounds {
  int base, lo[2], hi[2];
  bool mask;
};

// Causal context tiles (target) end at the row's position; a sliding-window drafter layer's context
// tiles start at the row's window (key kv_end + slot - window + 1, slot = slot0 + the row's
// position in the item) and its block tile, with block_causal, ends at the row's slot.
// row_pos[h]: position in the item of row r0 + 8h.
template <bool kCausal>
__device__ __forceinline__ TileBounds ForwardTileBounds(const DflashAttnFwdParams& p,
                                                        const AttnFwdItem& it, bool is_ctx,
                                                        int kstart, int klen, int slot0,
                                                        const int (&row_pos)[2]) {
  TileBounds b{is_ctx ? kstart : 0, {INT_MIN, INT_MIN}, {INT_MAX, INT_MAX}, klen < 64};
  if (kCausal && is_ctx) {
    b.hi[0] = it.q_pos + row_pos[0], b.hi[1] = it.q_pos + row_pos[1];
    b.mask = b.mask || kstart + 63 > it.q_pos;
  } else if (!kCausal && is_ctx && p.window > 0) {
    const int lo0 = it.kv_end + slot0 - p.window + 1;  // the item's first position's first key
    b.lo[0] = lo0 + row_pos[0], b.lo[1] = lo0 + row_pos[1];
    b.mask = b.mask || kstart < lo0 + it.n_pos - 1;
  } else if (!kCausal && !is_ctx && p.block_causal) {
    b.hi[0] = slot0 + row_pos[0], b.hi[1] = slot0 + row_pos[1];
    b.mask = true;
  }
  return b;
}

// The forward's online softmax over one tile of scores s [64 rows x 64 keys] (this thread's part):
// scales to the log2 domain, hides the keys that `b` hides, updates the running max and sum, and
// leaves P = exp2(s - max) in s and the factor that rescales the running output in `alpha`.
__device__ __forceinline__ void SoftmaxTile(float (&s)[8][4], float scale_log2, int lane, int klen,
                                            const TileBounds& b, float (&m_run)[2],
                                            float (&l_run)[2], float (&alpha)[2]) {
  float m_tile[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[nt][e] * scale_log2;
      if (b.mask) {
        const int col = nt * 8 + (lane & 3) * 2 + (e & 1);
        const int key = b.base + col, h = e >> 1;
        if (col >= klen || key < b.lo[h] || key > b.hi[h]) x = -CUDART_INF_F;
      }
      s[nt][e] = x;
      m_tile[e >> 1] = fmaxf(m_tile[e >> 1], x);
    }
  }
  float m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_tile[h] = fmaxf(m_tile[h], __shfl_xor_sync(0xffffffffu, m_tile[h], 1));
    m_tile[h] = fmaxf(m_tile[h], __shfl_xor_sync(0xffffffffu, m_tile[h], 2));
    const float m_new = fmaxf(m_run[h], m_tile[h]);
    m_use[h] = m_new == -CUDART_INF_F ? 0.f : m_new;  // a row with nothing visible yet
    alpha[h] = exp2f(m_run[h] - m_use[h]);
    m_run[h] = m_new;
    l_run[h] *= alpha[h];
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = exp2f(s[nt][e] - m_use[e >> 1]);
      s[nt][e] = pe;
      l_run[e >> 1] += pe;
    }
  }
}

// Rows of `acc` times alpha[0] (row lane/4) and alpha[1] (row lane/4 + 8).
template <int N>
__device__ __forceinline__ void ScaleRows(float (&acc)[N][4], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    acc[i][0] *= alpha[0], acc[i][1] *= alpha[0];
    acc[i][2] *= alpha[1], acc[i][3] *= alpha[1];
  }
}

// The A fragment (mma.sync and wgmma's register operand) of k-step j, keys 16j..16j+15, from P.
__device__ __forceinline__ void PackA(const float (&p)[8][4], int j, uint32_t (&a)[4]) {
  a[0] = PackBf16(p[2 * j][0], p[2 * j][1]);
  a[1] = PackBf16(p[2 * j][2], p[2 * j][3]);
  a[2] = PackBf16(p[2 * j + 1][0], p[2 * j + 1][1]);
  a[3] = PackBf16(p[2 * j + 1][2], p[2 * j + 1][3]);
}

// The forward's end: this thread's output rows normalized by the row sums, and their log2-domain
// log-sum-exp (+inf for a row that saw nothing); rows past the item's positions are not written.
template <int D>
__device__ __forceinline__ void WriteForwardRows(const DflashAttnFwdParams& p,
                                                 const AttnFwdItem& it, int g, const GroupRows& gr,
                                                 int r0, int lane, const float (&o_acc)[D / 8][4],
                                                 const float (&l_run)[2], const float (&m_run)[2]) {
  const int64_t q_row_stride = static_cast<int64_t>(p.hq) * D;
  bf16* o_tile =
      static_cast<bf16*>(p.o) + it.q_pos * q_row_stride + static_cast<int64_t>(g) * gr.group * D;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = r0 + h * 8;
    if (gr.pos(r) >= it.n_pos) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    bf16* orow = o_tile + gr.pos(r) * q_row_stride + gr.head(r) * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = nt * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t*>(orow + col) =
          PackBf16(o_acc[nt][2 * h] * inv, o_acc[nt][2 * h + 1] * inv);
    }
    if ((lane & 3) == 0) {
      const int64_t lse_idx =
          static_cast<int64_t>(it.q_pos + gr.pos(r)) * p.hq + g * gr.group + gr.head(r);
      p.lse[lse_idx] = l > 0.f ? m_run[h] + log2f(l) : CUDART_INF_F;
    }
  }
}

// The query rows of a backward visit that see this thread's keys key0 and key0 + 8 (slot = block
// slot of the row: slot_base + its position in the visit): slot in [lo[h], hi[h]] for key h; `on`
// false when every row sees them (then only key_ok applies).
struct SlotBounds {
  int lo[2], hi[2];
  bool on;
};

// A sliding-window layer: context key c is seen by slots k <= c - a_j + window - 1; with
// block_causal, block key k' by slots k >= k'. n_pos: positions of the visit.
__device__ __forceinline__ SlotBounds VisitSlotBounds(const DflashAttnBwdParams& p,
                                                      const AttnBwdItem& it, int anchor, int key0,
                                                      int slot_base, int n_pos) {
  SlotBounds b{{INT_MIN, INT_MIN}, {INT_MAX, INT_MAX}, false};
  if (it.masked && p.window > 0) {
    const int hi0 = it.key_row - anchor + p.window - 1;  // last slot that sees the tile's key 0
    b.hi[0] = hi0 + key0, b.hi[1] = hi0 + key0 + 8;
    b.on = hi0 < slot_base + n_pos - 1;
  } else if (!it.masked && p.block_causal) {
    b.lo[0] = key0, b.lo[1] = key0 + 8;
    b.on = true;
  }
  return b;
}

// The backward's P^T for this thread's keys key0 (key_ok[0]) and key0 + 8 (key_ok[1]) over query
// rows 16j..16j+15 of a visit (n-tiles 2j, 2j+1): exp2(S^T * scale_log2 - lse[row]) in place of
// S^T, 0 for hidden (key, row) pairs. (Per k-step, so that a caller can pack each step before the
// next.)
__device__ __forceinline__ void ProbsT(float (&s)[8][4], int j, const float* lse,
                                       const bool (&key_ok)[2], const SlotBounds& sb,
                                       const GroupRows& gr, int slot_base, float scale_log2,
                                       int lane) {
#pragma unroll
  for (int nt = 2 * j; nt < 2 * j + 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + (lane & 3) * 2 + (e & 1), h = e >> 1;
      bool ok = key_ok[h];
      if (sb.on) {
        const int slot = slot_base + gr.pos(col);
        ok = ok && slot >= sb.lo[h] && slot <= sb.hi[h];
      }
      s[nt][e] = ok ? exp2f(s[nt][e] * scale_log2 - lse[col]) : 0.f;
    }
  }
}

// dS^T = P^T (dP^T - delta[row]) in place of P^T, for query rows 16j..16j+15.
__device__ __forceinline__ void GradScoresT(float (&p)[8][4], int j, const float (&dp)[8][4],
                                            const float* delta, int lane) {
#pragma unroll
  for (int nt = 2 * j; nt < 2 * j + 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + (lane & 3) * 2 + (e & 1);
      p[nt][e] = p[nt][e] * (dp[nt][e] - delta[col]);
    }
  }
}

// dQ rows += acc (n-tiles at columns col_base + 8i) as fp32 atomics. Lanes l and l^1 swap halves
// so that each adds 4 consecutive columns of one row (one 16-byte atomic instead of two 8-byte
// ones): even lanes take row lane/4, odd lanes row lane/4 + 8, whose start is `row`.
template <int N>
__device__ __forceinline__ void AtomicAddRows(const float (&acc)[N][4], float* row, int col_base,
                                              int lane, bool valid) {
  const bool odd = lane & 1;
#pragma unroll
  for (int nt = 0; nt < N; ++nt) {
    const float recv0 = __shfl_xor_sync(0xffffffffu, odd ? acc[nt][0] : acc[nt][2], 1);
    const float recv1 = __shfl_xor_sync(0xffffffffu, odd ? acc[nt][1] : acc[nt][3], 1);
    const int col = col_base + nt * 8 + ((lane & 3) & ~1) * 2;
    if (valid) {
      atomicAdd(reinterpret_cast<float4*>(row + col),
                odd ? make_float4(recv0, recv1, acc[nt][2], acc[nt][3])
                    : make_float4(acc[nt][0], acc[nt][1], recv0, recv1));
    }
  }
}

// The backward's end: dK (times the softmax scale) and dV of this thread's keys key0 and key0 + 8
// of the item, N n-tiles from column `col0` of kv head g.
template <int N>
__device__ __forceinline__ void WriteKeyRows(const DflashAttnBwdParams& p, const AttnBwdItem& it,
                                             int g, int col0, int key0, int lane,
                                             const float (&dk_acc)[N][4],
                                             const float (&dv_acc)[N][4]) {
  const int64_t kv_row_stride = static_cast<int64_t>(p.hkv) * p.head_dim;
  bf16* dk = static_cast<bf16*>(p.dk);
  bf16* dv = static_cast<bf16*>(p.dv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + h * 8;
    if (key >= it.n_keys) continue;
    const int64_t off = (it.key_row + key) * kv_row_stride + g * p.head_dim + col0;
#pragma unroll
    for (int nt = 0; nt < N; ++nt) {
      const int col = nt * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t*>(dk + off + col) =
          PackBf16(dk_acc[nt][2 * h] * p.scale, dk_acc[nt][2 * h + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv + off + col) =
          PackBf16(dv_acc[nt][2 * h], dv_acc[nt][2 * h + 1]);
    }
  }
}

}  // namespace dflash::kernels::attn

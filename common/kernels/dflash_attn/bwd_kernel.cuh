// Backward of the fused DFlash attention, key-centric (flash-attention 2 style): one CTA of 4 warps
// per (key tile, kv head) holds K and V of up to 64 keys and visits every query tile that sees
// them: for a context tile, the tiles of the later anchors of the same document; for a block tile,
// its one anchor. Per visit, with the forward's log-sum-exp and delta = rowsum(dO * O):
//   S^T = K Q^T, P^T = exp2(S^T * scale_log2 - lse), dV += P^T dO,
//   dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q, dQ += dS K (fp32 atomics),
// warp w owning keys 16w..16w+15 for everything but dQ, where it owns query rows 16w..16w+15.
// dK and dV stay in registers for the whole item: no two items share a key row of one kv head.
#pragma once

#include <math_constants.h>

#include "common/kernels/dflash_attn/mma.cuh"
#include "common/kernels/dflash_attn/params.h"
#include "common/kernels/dflash_attn/tile_common.cuh"

namespace dflash::kernels::attn {

template <int D>
constexpr int BwdSmemBytes() {
  // K, V, 2 x (Q, dO), dS^T [64 keys][64 rows], 2 x (lse, delta) of 64 rows
  return (6 * TileElems<D>() + TileElems<64>()) * 2 + 4 * 64 * 4;
}

template <int D>
__global__ void __launch_bounds__(128, 2) DflashAttnBwdKernel(const DflashAttnBwdParams p) {
  constexpr int kSteps = D / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* s_k = reinterpret_cast<bf16*>(smem_raw);
  bf16* s_v = s_k + TileElems<D>();
  bf16* s_q = s_v + TileElems<D>();        // 2 buffers
  bf16* s_do = s_q + 2 * TileElems<D>();   // 2 buffers
  bf16* s_ds = s_do + 2 * TileElems<D>();  // [64 keys][64 rows], padded rows of 64
  float* s_lse = reinterpret_cast<float*>(s_ds + TileElems<64>());  // 2 x 64
  float* s_delta = s_lse + 2 * 64;                                  // 2 x 64

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
    LoadTile<D>(
        s_k, it.n_keys, [&](int r) { return kb + r * kv_row_stride; }, k, tid);
    LoadTile<D>(
        s_v, it.n_keys, [&](int r) { return vb + r * kv_row_stride; }, v, tid);
  }

  // Query tile u of the item: anchor j_begin + u / q_tiles_per_anchor, positions from its block.
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
    LoadTile<D>(
        s_q + buf * TileElems<D>(), n_pos * group, [&](int r) { return q + base + row_off(r); }, q,
        tid);
    LoadTile<D>(
        s_do + buf * TileElems<D>(), n_pos * group, [&](int r) { return dout + base + row_off(r); },
        dout, tid);
    if (tid < 64) {
      const bool valid = gr.pos(tid) < n_pos;
      const int64_t idx = static_cast<int64_t>(pos + gr.pos(tid)) * p.hq + g * group + gr.head(tid);
      s_lse[buf * 64 + tid] = valid ? p.lse[idx] : CUDART_INF_F;
      s_delta[buf * 64 + tid] = valid ? p.delta[idx] : 0.f;
    }
  };
  if (n_visits > 0) load_q(0, 0);
  CpAsyncCommit();

  float dk_acc[2 * kSteps][4], dv_acc[2 * kSteps][4];
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) {
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
    __syncthreads();
    const int buf = u & 1;
    const bf16* qt = s_q + buf * TileElems<D>();
    const bf16* dot = s_do + buf * TileElems<D>();
    const float* lse = s_lse + buf * 64;
    const float* delta = s_delta + buf * 64;
    int n_pos;
    const int pos = visit_pos(u, &n_pos);
    // A padding anchor inside a document's range sees nothing: skip (uniform over the CTA).
    if (anchor >= 0) {
      // S^T = K_w Q^T [16 keys x 64 rows], then P^T.
      float s_acc[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) s_acc[i][0] = s_acc[i][1] = s_acc[i][2] = s_acc[i][3] = 0.f;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint32_t a[4];
        Ldsm4(a, AddrA<D>(s_k, warp * 16, s * 16, lane));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          Ldsm4(b, AddrBn<D>(qt, np * 16, s * 16, lane));
          Mma(s_acc[2 * np], a, b[0], b[1]);
          Mma(s_acc[2 * np + 1], a, b[2], b[3]);
        }
      }
      const int limit = it.masked ? min(it.n_keys, anchor - it.key_row) : it.n_keys;
      const bool key_ok[2] = {key0 < limit, key0 + 8 < limit};
      const int slot_base = pos - j * p.block_size;
      const SlotBounds sb = VisitSlotBounds(p, it, anchor, key0, slot_base, n_pos);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        ProbsT(s_acc, jj, lse, key_ok, sb, gr, slot_base, p.scale_log2, lane);
      }
      // dV += P^T dO: k-steps over the 64 query rows.
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t a[4];
        PackA(s_acc, jj, a);
#pragma unroll
        for (int dp = 0; dp < kSteps; ++dp) {
          uint32_t b[4];
          Ldsm4T(b, AddrBt<D>(dot, jj * 16, dp * 16, lane));
          Mma(dv_acc[2 * dp], a, b[0], b[1]);
          Mma(dv_acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
      // dP^T = V_w dO^T, dS^T = P^T (dP^T - delta).
      float dp_acc[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) dp_acc[i][0] = dp_acc[i][1] = dp_acc[i][2] = dp_acc[i][3] = 0.f;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint32_t a[4];
        Ldsm4(a, AddrA<D>(s_v, warp * 16, s * 16, lane));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          Ldsm4(b, AddrBn<D>(dot, np * 16, s * 16, lane));
          Mma(dp_acc[2 * np], a, b[0], b[1]);
          Mma(dp_acc[2 * np + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) GradScoresT(s_acc, jj, dp_acc, delta, lane);
        // dK += dS^T Q; dS^T also goes to shared memory for dQ.
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t a[4];
        PackA(s_acc, jj, a);
        const int col = jj * 16 + (lane & 3) * 2;
        *reinterpret_cast<uint32_t*>(s_ds + Swz<64>(key0, col)) = a[0];
        *reinterpret_cast<uint32_t*>(s_ds + Swz<64>(key0 + 8, col)) = a[1];
        *reinterpret_cast<uint32_t*>(s_ds + Swz<64>(key0, col + 8)) = a[2];
        *reinterpret_cast<uint32_t*>(s_ds + Swz<64>(key0 + 8, col + 8)) = a[3];
#pragma unroll
        for (int dp = 0; dp < kSteps; ++dp) {
          uint32_t b[4];
          Ldsm4T(b, AddrBt<D>(qt, jj * 16, dp * 16, lane));
          Mma(dk_acc[2 * dp], a, b[0], b[1]);
          Mma(dk_acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();
      // dQ rows 16w..16w+15 += dS K over the 64 keys, 32 columns at a time, into fp32 atomics.
      uint32_t a_ds[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) Ldsm4T(a_ds[kk], AddrAt<64>(s_ds, kk * 16, warp * 16, lane));
      const int r = warp * 16 + (lane >> 2) + ((lane & 1) ? 8 : 0);  // AtomicAddRows' row
      float* row =
          p.dq_accum + (static_cast<int64_t>(pos + gr.pos(r)) * p.hq + g * group + gr.head(r)) * D;
#pragma unroll
      for (int dc = 0; dc < kSteps / 2; ++dc) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int dp = 0; dp < 2; ++dp) {
            uint32_t b[4];
            Ldsm4T(b, AddrBt<D>(s_k, kk * 16, dc * 32 + dp * 16, lane));
            Mma(acc[2 * dp], a_ds[kk], b[0], b[1]);
            Mma(acc[2 * dp + 1], a_ds[kk], b[2], b[3]);
          }
        }
        AtomicAddRows(acc, row, dc * 32, lane, gr.pos(r) < n_pos);
      }
    }
    __syncthreads();  // s_ds and this visit's buffers are rewritten next
  }
  CpAsyncWait<0>();

  WriteKeyRows(p, it, g, /*col0=*/0, key0, lane, dk_acc, dv_acc);
}

// delta[row] = sum_d dO[row, d] * O[row, d] in fp32, one warp per (position, head) row.
template <int D>
__global__ void DflashAttnDeltaKernel(const bf16* __restrict__ out, const bf16* __restrict__ dout,
                                      float* __restrict__ delta, int64_t rows) {
  const int64_t row = blockIdx.x * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float acc = 0.f;
  for (int d = lane * 2; d < D; d += 64) {
    const float2 a =
        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + row * D + d));
    const float2 b =
        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + row * D + d));
    acc += a.x * b.x + a.y * b.y;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) delta[row] = acc;
}

// dq = bf16(dq_accum * scale), 4 elements per thread.
__global__ void DflashAttnDqKernel(const float4* __restrict__ acc, uint2* __restrict__ dq,
                                   int64_t n4, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 x = acc[i];
    dq[i] = make_uint2(PackBf16(x.x * scale, x.y * scale), PackBf16(x.z * scale, x.w * scale));
  }
}

}  // namespace dflash::kernels::attn

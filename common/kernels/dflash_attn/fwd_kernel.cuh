// Forward of the fused DFlash attention (and of the target's packed causal attention): one CTA of
// 4 warps per (work item, kv head); flash-attention style online softmax over 64-key tiles with
// cp.async double buffering, mma.sync m16n8k16 bf16 -> fp32. No score matrix is ever stored.
//
// The tile's 64 rows are P positions x G heads of one kv group (params.h), so each K/V tile read
// from memory serves all G heads. Keys visited: the item's context range [kv_begin, kv_end) in
// tiles of 64 (the last one partial), then (drafter) the anchor's B block rows. Work items come
// from schedule.h, heaviest first, so the long contexts start early.
#pragma once

#include <math_constants.h>

#include "common/kernels/dflash_attn/mma.cuh"
#include "common/kernels/dflash_attn/params.h"
#include "common/kernels/dflash_attn/tile_common.cuh"

namespace dflash::kernels::attn {

template <int D>
constexpr int FwdSmemBytes() {
  return 4 * TileElems<D>() * 2;  // Q, 2 x K, V
}

// Pipeline: K of tile t+1 loads during Q K^T and softmax of tile t (two K buffers); V of tile t+1
// loads from the end of P V of tile t (one V buffer). Q fragments are read from shared memory at
// each use: with 64 KB of shared memory and <= 168 registers, three CTAs (12 warps) share an SM.
template <int D, bool kCausal>
__global__ void __launch_bounds__(128, D <= 128 ? 3 : 1)
    DflashAttnFwdKernel(const DflashAttnFwdParams p) {
  constexpr int kSteps = D / 16;  // k-steps of Q K^T, n-tile pairs of P V
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* s_q = reinterpret_cast<bf16*>(smem_raw);
  bf16* s_k = s_q + TileElems<D>();      // 2 buffers
  bf16* s_v = s_k + 2 * TileElems<D>();  // 1 buffer

  const AttnFwdItem it = p.items[blockIdx.x];
  const int g = blockIdx.y;
  const int group = p.hq / p.hkv;
  const GroupRows gr(group);  // tile row -> (position, head)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  const int64_t q_row_stride = static_cast<int64_t>(p.hq) * D;  // elements per position
  const int64_t kv_row_stride = static_cast<int64_t>(p.hkv) * D;
  const bf16* q_tile = q + it.q_pos * q_row_stride + static_cast<int64_t>(g) * group * D;
  // Tile row r -> position r / group, head r % group of the kv group.
  auto q_row = [&](int r) { return q_tile + gr.pos(r) * q_row_stride + gr.head(r) * D; };

  const int n_ctx_tiles = it.kv_end > it.kv_begin ? (it.kv_end - it.kv_begin + 63) / 64 : 0;
  const int n_tiles = n_ctx_tiles + (it.blk_row >= 0 ? 1 : 0);
  auto tile_start = [&](int t) { return t < n_ctx_tiles ? it.kv_begin + t * 64 : it.blk_row; };
  auto tile_len = [&](int t) {
    return t < n_ctx_tiles ? min(64, it.kv_end - it.kv_begin - t * 64) : it.blk_len;
  };
  auto load_k = [&](int t) {
    const bf16* kb = k + tile_start(t) * kv_row_stride + g * D;
    LoadTile<D>(
        s_k + (t & 1) * TileElems<D>(), tile_len(t), [&](int r) { return kb + r * kv_row_stride; },
        k, tid);
  };
  auto load_v = [&](int t) {
    const bf16* vb = v + tile_start(t) * kv_row_stride + g * D;
    LoadTile<D>(
        s_v, tile_len(t), [&](int r) { return vb + r * kv_row_stride; }, v, tid);
  };

  // Commit groups, in order: {Q, K0}, {V0}, then per tile t: {K(t+1)}, {V(t+1)}.
  LoadTile<D>(s_q, it.n_pos * group, q_row, q, tid);
  if (n_tiles > 0) load_k(0);
  CpAsyncCommit();
  if (n_tiles > 0) load_v(0);
  CpAsyncCommit();

  // Rows of this thread in the tile: r0 = 16*warp + lane/4 and r0 + 8.
  const int r0 = warp * 16 + (lane >> 2);
  const int row_pos[2] = {gr.pos(r0), gr.pos(r0 + 8)};               // positions in the item
  const int slot0 = p.block_size > 0 ? it.q_pos % p.block_size : 0;  // block slot of position 0
  float o_acc[2 * kSteps][4];
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};

  for (int t = 0; t < n_tiles; ++t) {
    CpAsyncWait<1>();  // K(t) (and Q) landed; V(t) may still be in flight
    __syncthreads();   // ... for every thread; and K buffer (t+1)&1 is no longer read
    if (t + 1 < n_tiles) load_k(t + 1);
    CpAsyncCommit();  // possibly empty: keeps the group count uniform
    const bf16* kt = s_k + (t & 1) * TileElems<D>();
    const bf16* vt = s_v;
    const int kstart = tile_start(t), klen = tile_len(t);
    const int key_steps = (klen + 15) / 16;  // 16-key groups holding any real key

    float s_acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) s_acc[i][0] = s_acc[i][1] = s_acc[i][2] = s_acc[i][3] = 0.f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      uint32_t a[4];
      Ldsm4(a, AddrA<D>(s_q, warp * 16, s * 16, lane));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (np < key_steps) {
          uint32_t b[4];
          Ldsm4(b, AddrBn<D>(kt, np * 16, s * 16, lane));
          Mma(s_acc[2 * np], a, b[0], b[1]);
          Mma(s_acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
    // Scale, mask (keys past the tile; causal: keys after the row's position; a sliding-window
    // layer: keys outside the row's window), online softmax.
    const TileBounds bounds =
        ForwardTileBounds<kCausal>(p, it, t < n_ctx_tiles, kstart, klen, slot0, row_pos);
    float alpha[2];
    SoftmaxTile(s_acc, p.scale_log2, lane, klen, bounds, m_run, l_run, alpha);
    ScaleRows(o_acc, alpha);
    CpAsyncWait<1>();  // V(t) landed (K(t+1) may be in flight)
    __syncthreads();
    // O += P V: the accumulators of n-tiles 2j, 2j+1 are the A fragment of key step j.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < key_steps) {
        uint32_t a[4];
        PackA(s_acc, j, a);
#pragma unroll
        for (int dp = 0; dp < kSteps; ++dp) {
          uint32_t b[4];
          Ldsm4T(b, AddrBt<D>(vt, j * 16, dp * 16, lane));
          Mma(o_acc[2 * dp], a, b[0], b[1]);
          Mma(o_acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with V(t)
    if (t + 1 < n_tiles) load_v(t + 1);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();

  WriteForwardRows<D>(p, it, g, gr, r0, lane, o_acc, l_run, m_run);
}

}  // namespace dflash::kernels::attn

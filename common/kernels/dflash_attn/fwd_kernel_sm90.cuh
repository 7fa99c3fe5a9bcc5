// Forward of the fused DFlash attention (and of the target's packed causal attention) on Hopper
// (sm_90a), head dims 64 and 128: the work split, pipeline and online softmax of fwd_kernel.cuh,
// with Q K^T and P V issued as warpgroup MMAs (wgmma.cuh) on swizzled shared-memory tiles:
//   S  = Q K^T   A = Q (smem, K-major), B = K (smem, K-major); 16 columns only for a tile of at
//                most 16 keys (the drafter's block)
//   O += P V     A = P (registers), B = V (smem, MN-major), k-steps over the tile's real keys only
#pragma once

#include <math_constants.h>

#include "common/kernels/dflash_attn/params.h"
#include "common/kernels/dflash_attn/tile_common.cuh"
#include "common/kernels/dflash_attn/wgmma.cuh"

namespace dflash::kernels::attn {

template <int D>
constexpr int FwdSm90SmemBytes() {
  return 4 * 64 * D * 2 + 1024;  // Q, 2 x K, V; 1 KiB for the 1024-byte alignment
}

template <int D, bool kCausal>
__global__ void __launch_bounds__(128, 3) DflashAttnFwdSm90Kernel(const DflashAttnFwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kSteps = D / 16, kTile = 64 * D;
  extern __shared__ unsigned char smem_raw[];
  bf16* s_q = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                      ~static_cast<uintptr_t>(1023));
  bf16* s_k = s_q + kTile;      // 2 buffers
  bf16* s_v = s_k + 2 * kTile;  // 1 buffer

  const AttnFwdItem it = p.items[blockIdx.x];
  const int g = blockIdx.y;
  const int group = p.hq / p.hkv;
  const GroupRows gr(group);  // tile row -> (position, head)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  const int64_t q_row_stride = static_cast<int64_t>(p.hq) * D;
  const int64_t kv_row_stride = static_cast<int64_t>(p.hkv) * D;
  const bf16* q_tile = q + it.q_pos * q_row_stride + static_cast<int64_t>(g) * group * D;
  auto q_row = [&](int r) { return q_tile + gr.pos(r) * q_row_stride + gr.head(r) * D; };

  const int n_ctx_tiles = it.kv_end > it.kv_begin ? (it.kv_end - it.kv_begin + 63) / 64 : 0;
  const int n_tiles = n_ctx_tiles + (it.blk_row >= 0 ? 1 : 0);
  auto tile_start = [&](int t) { return t < n_ctx_tiles ? it.kv_begin + t * 64 : it.blk_row; };
  auto tile_len = [&](int t) {
    return t < n_ctx_tiles ? min(64, it.kv_end - it.kv_begin - t * 64) : it.blk_len;
  };
  auto load_k = [&](int t) {
    const bf16* kb = k + tile_start(t) * kv_row_stride + g * D;
    LoadTileSw128<D>(
        s_k + (t & 1) * kTile, tile_len(t), [&](int r) { return kb + r * kv_row_stride; }, k, tid);
  };
  auto load_v = [&](int t) {
    const bf16* vb = v + tile_start(t) * kv_row_stride + g * D;
    LoadTileSw128<D>(
        s_v, tile_len(t), [&](int r) { return vb + r * kv_row_stride; }, v, tid);
  };

  // Commit groups, in order: {Q, K0}, {V0}, then per tile t: {K(t+1)}, {V(t+1)}.
  LoadTileSw128<D>(s_q, it.n_pos * group, q_row, q, tid);
  if (n_tiles > 0) load_k(0);
  CpAsyncCommit();
  if (n_tiles > 0) load_v(0);
  CpAsyncCommit();

  const int r0 = warp * 16 + (lane >> 2);
  const int row_pos[2] = {gr.pos(r0), gr.pos(r0 + 8)};               // positions in the item
  const int slot0 = p.block_size > 0 ? it.q_pos % p.block_size : 0;  // block slot of position 0
  float o_acc[2 * kSteps][4];
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};

  for (int t = 0; t < n_tiles; ++t) {
    CpAsyncWait<1>();  // K(t) (and Q) landed; V(t) may still be in flight
    FenceProxyAsync();
    __syncthreads();  // ... for every thread; and K buffer (t+1)&1 is no longer read
    if (t + 1 < n_tiles) load_k(t + 1);
    CpAsyncCommit();  // possibly empty: keeps the group count uniform
    const bf16* kt = s_k + (t & 1) * kTile;
    const int kstart = tile_start(t), klen = tile_len(t);
    const int key_steps = (klen + 15) / 16;  // 16-key groups holding any real key

    float s_acc[8][4];
    WgmmaFence();
    if (klen <= 16) {
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        WgmmaSS_N16<0, 0>(reinterpret_cast<float(&)[2][4]>(s_acc[0]), DescK(s_q, s), DescK(kt, s),
                          s > 0);
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSteps; ++s) WgmmaSS_N64<0, 0>(s_acc, DescK(s_q, s), DescK(kt, s), s > 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs(s_acc);
    // Scale, mask (keys past the tile; causal: keys after the row's position; a sliding-window
    // layer: keys outside the row's window), online softmax.
    const TileBounds bounds =
        ForwardTileBounds<kCausal>(p, it, t < n_ctx_tiles, kstart, klen, slot0, row_pos);
    float alpha[2];
    SoftmaxTile(s_acc, p.scale_log2, lane, klen, bounds, m_run, l_run, alpha);
    uint32_t a_p[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) PackA(s_acc, j, a_p[j]);
    ScaleRows(o_acc, alpha);
    CpAsyncWait<1>();  // V(t) landed (K(t+1) may be in flight)
    FenceProxyAsync();
    __syncthreads();
    // O += P V over the key steps that hold real keys.
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < key_steps) {
        if constexpr (D == 128) {
          WgmmaRS_N128<1>(o_acc, a_p[j], DescMn(s_v, j), 1);
        } else {
          WgmmaRS_N64<1>(o_acc, a_p[j], DescMn(s_v, j), 1);
        }
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs(o_acc);
#pragma unroll
    for (int j = 0; j < 4; ++j) FenceRegs(a_p[j]);
    __syncthreads();  // every warp is done with V(t)
    if (t + 1 < n_tiles) load_v(t + 1);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();

  WriteForwardRows<D>(p, it, g, gr, r0, lane, o_acc, l_run, m_run);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace dflash::kernels::attn

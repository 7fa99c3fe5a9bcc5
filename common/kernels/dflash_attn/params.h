// Parameters of the fused DFlash attention kernels (fwd_kernel.cuh, bwd_kernel.cuh): plain
// pointers, strides and the work lists of schedule.h, no framework types, so that the CUDA
// translation units stay free of LibTorch headers.
//
// Row layout. q and o are [Q, Hq, D] and k, v are [rows_kv, Hkv, D], all contiguous bf16; a CTA
// owns one kv head g and a tile of 64 "rows" = P positions x G query heads (G = Hq / Hkv in 1..64,
// P = 64 / G; the last 64 % G rows stay empty): tile row r is position r / G and query head
// g*G + r % G. All G heads of a group read the same keys under the same mask, so a K/V tile
// loaded once serves up to 64 rows.
#pragma once

#include <cstdint>

namespace dflash::kernels {

inline constexpr int kAttnTileRows = 64;  // query rows per CTA tile (positions x heads of a group)
inline constexpr int kAttnTileKeys = 64;  // keys per K/V tile

// One forward work item = one tile of positions [q_pos, q_pos + n_pos) that share a key range.
// Causal mode (target): row of position p sees keys [kv_begin, p + 1) (key index == position).
// DFlash mode (drafter): every row sees context keys [kv_begin, kv_end), then the block keys
// [blk_row, blk_row + blk_len) when blk_row >= 0. kv_end == kv_begin and blk_row < 0 (a padding
// anchor) writes zero rows and an LSE of +inf. A sliding-window layer (params' window > 0) also
// hides, from the row of block slot k (k = position % block_size), the context keys before
// kv_end + k - window + 1, and with block_causal the block keys after slot k.
struct AttnFwdItem {
  int32_t q_pos, n_pos, kv_begin, kv_end, blk_row, blk_len;
};

// One backward work item = one tile of keys [key_row, key_row + n_keys) (n_keys <= 64) and the
// anchors [j_begin, j_end) that see them; `masked`: key c is seen by anchor j only if c < a_j
// (context tiles); unmasked: block tiles, seen whole by their one anchor. A sliding-window layer
// also hides key c from slot k of anchor j when c < a_j + k - window + 1 (context tiles), and with
// block_causal block key k' from the slots before k' (block tiles).
struct AttnBwdItem {
  int32_t key_row, n_keys, j_begin, j_end, masked, pad;
};

struct DflashAttnFwdParams {
  const void* q = nullptr;  // [Q, Hq, D]
  const void* k = nullptr;  // [rows_kv, Hkv, D]
  const void* v = nullptr;
  void* o = nullptr;     // [Q, Hq, D]
  float* lse = nullptr;  // [Q, Hq]: log2-domain log-sum-exp of the scaled scores (+inf: none)
  const AttnFwdItem* items = nullptr;
  int32_t n_items = 0;
  int32_t q_rows = 0, kv_rows = 0, hq = 0, hkv = 0, head_dim = 0;
  float scale_log2 = 0.f;  // softmax scale * log2(e)
  bool causal = false;
  // Drafter mode, sliding-window layers: window 0 (none) or >= block_size; block_causal: slot k
  // sees its block's slots k' <= k only.
  int32_t block_size = 0, window = 0;
  bool block_causal = false;
};

struct DflashAttnBwdParams {
  const void* q = nullptr;  // [Q, Hq, D]
  const void* k = nullptr;  // [rows_kv, Hkv, D]
  const void* v = nullptr;
  const void* o = nullptr;     // [Q, Hq, D]
  const void* dout = nullptr;  // [Q, Hq, D]
  const float* lse = nullptr;  // [Q, Hq] from the forward
  float* delta = nullptr;      // [Q, Hq] scratch: rowsum(dO * O)
  float* dq_accum = nullptr;   // [Q, Hq, D] fp32 scratch, zeroed by the caller
  void* dq = nullptr;          // [Q, Hq, D]
  void* dk = nullptr;          // [rows_kv, Hkv, D], zeroed by the caller (keys nobody sees)
  void* dv = nullptr;
  const int32_t* anchors = nullptr;  // [n] a_j (drafter mode: key rows of the anchors)
  const AttnBwdItem* items = nullptr;
  int32_t n_items = 0;
  int32_t block_size = 0;  // B: anchor j owns query positions j*B .. j*B + B - 1
  int32_t q_rows = 0, kv_rows = 0, hq = 0, hkv = 0, head_dim = 0;
  float scale = 0.f, scale_log2 = 0.f;
  int32_t window = 0;         // as in DflashAttnFwdParams
  bool block_causal = false;  // as in DflashAttnFwdParams
};

// Launchers (stream is a cudaStream_t). Return the CUDA error of the launches (0 on success);
// -1 when head_dim or the head grouping has no compiled kernel (see SupportsFusedAttention).
int LaunchDflashAttnFwd(const DflashAttnFwdParams& p, void* stream);
int LaunchDflashAttnBwd(const DflashAttnBwdParams& p, void* stream);

}  // namespace dflash::kernels

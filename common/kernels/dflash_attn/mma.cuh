// Warp-level tensor-core helpers for the attention kernels: cp.async tile loads into a padded
// shared-memory layout, ldmatrix fragment loads and the m16n8k16 bf16 MMA with fp32 accumulators.
//
// Shared-memory tiles hold 64 rows of D bf16, each row padded to D + 8 (see Swz).
//
// Fragment layouts (PTX ISA, mma.m16n8k16): lane l holds, of A (16x16, row-major) rows l/4 and
// l/4+8 at columns 2(l%4)+{0,1} and +8; of B (16x8) column l/4 at rows 2(l%4)+{0,1} and +8; of the
// accumulator C (16x8) rows l/4 and l/4+8 at columns 2(l%4)+{0,1}. The accumulators of two
// neighbouring n-tiles are therefore exactly the A fragment of the next product (P @ V).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dflash::kernels::attn {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of (row, col) in a tile whose rows are padded by 16 bytes (D + 8 elements): the 8
// rows that one ldmatrix phase reads start in 8 different 16-byte bank groups, and every address
// is a per-thread base plus a compile-time offset (an XOR swizzle cost ~4 integer instructions per
// ldmatrix, the backward's top stall).
template <int D>
__device__ __forceinline__ int Swz(int row, int col) {
  return row * (D + 8) + col;
}
template <int D>
__host__ __device__ constexpr int TileElems() {
  return 64 * (D + 8);
}

// 16-byte asynchronous copy; src_bytes 0 writes zeros (rows past the end of a tile).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(n));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Lane addresses of the x4 loads (see the layouts above), for a 16x16 region at (r0, c0):
//   A, stored [m][k]:                 row r0 + l%16,               col c0 + (l/16)*8
//   B from [n][k] (non-trans) 2 n-tiles: row r0 + l%8 + (l/16)*8,  col c0 + ((l/8)%2)*8
//     -> r[0], r[1] = b0, b1 of n-tile r0; r[2], r[3] = of n-tile r0+8
//   B from [k][n] (trans) 2 n-tiles:  row r0 + l%8 + ((l/8)%2)*8,  col c0 + (l/16)*8
//     -> r[0], r[1] = b0, b1 of n-tile c0; r[2], r[3] = of n-tile c0+8
//   A from [k][m] (trans):            row r0 + l%8 + (l/16)*8,     col c0 + ((l/8)%2)*8
//     (rows are k, columns m) -> r[0..3] = a0..a3
template <int D>
__device__ __forceinline__ uint32_t AddrA(const __nv_bfloat16* base, int r0, int c0, int lane) {
  return SmemAddr(base + Swz<D>(r0 + (lane & 15), c0 + ((lane >> 4) << 3)));
}
template <int D>
__device__ __forceinline__ uint32_t AddrBn(const __nv_bfloat16* base, int r0, int c0, int lane) {
  return SmemAddr(base +
                  Swz<D>(r0 + (lane & 7) + ((lane >> 4) << 3), c0 + (((lane >> 3) & 1) << 3)));
}
template <int D>
__device__ __forceinline__ uint32_t AddrBt(const __nv_bfloat16* base, int r0, int c0, int lane) {
  return SmemAddr(base +
                  Swz<D>(r0 + (lane & 7) + (((lane >> 3) & 1) << 3), c0 + ((lane >> 4) << 3)));
}
template <int D>
__device__ __forceinline__ uint32_t AddrAt(const __nv_bfloat16* base, int r0, int c0, int lane) {
  return SmemAddr(base +
                  Swz<D>(r0 + (lane & 7) + ((lane >> 4) << 3), c0 + (((lane >> 3) & 1) << 3)));
}

// Copies rows [0, 64) of a tile: row i comes from `src(i)` (a pointer to D bf16) when i < n_valid,
// else is zero-filled (the copy then reads nothing; `any` is some valid global address).
// 128 threads, 16 bytes each per step.
template <int D, typename RowPtr>
__device__ __forceinline__ void LoadTile(__nv_bfloat16* smem, int n_valid, RowPtr src,
                                         const void* any, int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int i = tid; i < 64 * kChunks; i += 128) {
    const int row = i / kChunks, c = i % kChunks;
    const bool valid = row < n_valid;
    CpAsync16(smem + Swz<D>(row, c * 8), valid ? static_cast<const void*>(src(row) + c * 8) : any,
              valid);
  }
}

}  // namespace dflash::kernels::attn

// Hopper warpgroup MMA (wgmma, sm_90a) helpers for the attention kernels: the 128-byte swizzled
// shared-memory tile layout that wgmma reads, its matrix descriptors, and the instructions used by
// the backward (bwd_kernel_sm90.cuh).
//
// Tile layout. A 64-row tile of D bf16 columns is stored as D / 64 panels of [64 rows][64 columns]
// (8 KiB each, 1024-byte aligned); within a panel row r occupies 128 bytes whose eight 16-byte
// chunks are permuted by chunk ^ (r % 8) (the hardware's 128-byte swizzle, applied to address bits
// 4-6 from bits 7-9). The same tile serves as a K-major operand (the contraction runs along its
// columns: S^T = K Q^T) and as an MN-major one (it runs along its rows: dV += P^T dO), with
// different descriptors:
//   K-major:  8-row groups 1024 bytes apart (stride byte offset); a k-step of 16 columns advances
//             the start address by 32 bytes inside the panel, the next panel by 8 KiB.
//   MN-major: 8-row (k) groups 1024 bytes apart (stride byte offset), 64-column panels 8 KiB apart
//             (leading byte offset); a k-step of 16 rows advances the start address by 2 KiB.
//
// Fragments. wgmma's accumulator of an m64nN product and its register A operand are, per warp w of
// the warpgroup, rows 16w..16w+15 in exactly the layout of mma.sync m16n8k16 (mma.cuh), so d[i]
// below is the i-th 8-column n-tile. The asynchronous instructions read their register operands
// and write their accumulators after issue: FenceRegs keeps the compiler from touching them
// before WgmmaWait.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/kernels/dflash_attn/mma.cuh"

namespace dflash::kernels::attn {

// Host: whether to launch the wgmma kernels: on a device of compute capability 9.0 (the build
// targets sm_90a), unless the environment variable `env` (when not null) is "mma" (the mma.sync
// kernels, which other devices run, kept for comparison in scripts/bench and for the GPU tests).
inline bool UseSm90Kernels(const char* env) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  const char* forced = env != nullptr ? std::getenv(env) : nullptr;
  return major == 9 && minor == 0 && (forced == nullptr || std::strcmp(forced, "mma") != 0);
}

// Element offset of (row, col) in a swizzled tile (see above).
__device__ __forceinline__ int Sw128(int row, int col) {
  return ((col >> 6) << 12) + (row << 6) + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// Copies rows [0, 64) of a swizzled tile of D columns: row i from `src(i)` when i < n_valid, else
// zeros. 128 threads, one 16-byte chunk each per step.
template <int D, typename RowPtr>
__device__ __forceinline__ void LoadTileSw128(bf16* smem, int n_valid, RowPtr src, const void* any,
                                              int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int i = tid; i < 64 * kChunks; i += 128) {
    const int row = i / kChunks, c = i % kChunks;
    const bool valid = row < n_valid;
    CpAsync16(smem + Sw128(row, c * 8), valid ? static_cast<const void*>(src(row) + c * 8) : any,
              valid);
  }
}

// Shared-memory matrix descriptor with the 128-byte swizzle (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ uint64_t Desc128(const void* smem, uint32_t lead_bytes,
                                            uint32_t stride_bytes) {
  const uint64_t addr = SmemAddr(smem);
  return ((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lead_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}
// Descriptor of k-step s (16 columns) of a K-major swizzled tile.
__device__ __forceinline__ uint64_t DescK(const bf16* tile, int s) {
  return Desc128(tile + ((s >> 2) << 12) + ((s & 3) << 4), 16, 1024);
}
// Descriptor of k-step s (16 rows) of an MN-major swizzled tile.
__device__ __forceinline__ uint64_t DescMn(const bf16* tile, int s) {
  return Desc128(tile + (s << 10), 8192, 1024);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (stores, cp.async) visible to wgmma.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void FenceRegs(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
  }
}
__device__ __forceinline__ void FenceRegs(uint32_t (&a)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[e])::"memory");
}

// D (m64nN, fp32) (+)= A B, A and B from shared memory; kTransA / kTransB: 0 K-major, 1 MN-major.
template <int kTransA, int kTransB>
__device__ __forceinline__ void WgmmaSS_N64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                            int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

template <int kTransA, int kTransB>
__device__ __forceinline__ void WgmmaSS_N16(float (&d)[2][4], uint64_t desc_a, uint64_t desc_b,
                                            int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, "
      "%9, p, 1, 1, %11, %12;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// D (m64nN, fp32) (+)= A B, A from registers (the mma.sync A fragment of warp w's rows), B from
// shared memory (kTransB: 0 K-major, 1 MN-major).
template <int kTransB>
__device__ __forceinline__ void WgmmaRS_N64(float (&d)[8][4], const uint32_t (&a)[4],
                                            uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransB));
}

template <int kTransB>
__device__ __forceinline__ void WgmmaRS_N128(float (&d)[16][4], const uint32_t (&a)[4],
                                             uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransB));
}

}  // namespace dflash::kernels::attn

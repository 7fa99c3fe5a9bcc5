#include <cuda_runtime.h>

#include "common/kernels/dflash_attn/wgmma.cuh"
#include "tests/kernels/wgmma_check.h"

namespace dflash::kernels::testing {
namespace {

using attn::bf16;

// Writes an m64nN accumulator (mma.sync fragment layout per warp) to a row-major fp32 matrix.
template <int N>
__device__ void Store(const float (&d)[N / 8][4], float* out, int ld, int col0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = warp * 16 + (lane >> 2);
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
    const int c = col0 + nt * 8 + (lane & 3) * 2;
    out[r * ld + c] = d[nt][0];
    out[r * ld + c + 1] = d[nt][1];
    out[(r + 8) * ld + c] = d[nt][2];
    out[(r + 8) * ld + c + 1] = d[nt][3];
  }
}

__global__ void __launch_bounds__(128)
    WgmmaCheckKernel(const bf16* x, const bf16* y, const bf16* z, float* c1, float* c2, float* c3) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) bf16 s_x[64 * 128], s_y[64 * 128], s_z[64 * 64];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  attn::LoadTileSw128<128>(
      s_x, 64, [&](int r) { return x + r * 128; }, x, tid);
  attn::LoadTileSw128<128>(
      s_y, 64, [&](int r) { return y + r * 128; }, y, tid);
  attn::LoadTileSw128<64>(
      s_z, 64, [&](int r) { return z + r * 64; }, z, tid);
  attn::CpAsyncCommit();
  attn::CpAsyncWait<0>();
  attn::FenceProxyAsync();
  __syncthreads();

  float d64[8][4];
  attn::WgmmaFence();
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    attn::WgmmaSS_N64<0, 0>(d64, attn::DescK(s_x, s), attn::DescK(s_y, s), s > 0);
  }
  attn::WgmmaCommit();
  attn::WgmmaWait<0>();
  attn::FenceRegs(d64);
  Store<64>(d64, c1, 64, 0);

  // z's rows 16w.. in the register A layout, k-step jj = columns 16jj..16jj+15.
  uint32_t a[4][4];
  const int r = warp * 16 + (lane >> 2);
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    const int c = jj * 16 + (lane & 3) * 2;
    auto word = [&](int row, int col) {
      return *reinterpret_cast<const uint32_t*>(z + row * 64 + col);
    };
    a[jj][0] = word(r, c);
    a[jj][1] = word(r + 8, c);
    a[jj][2] = word(r, c + 8);
    a[jj][3] = word(r + 8, c + 8);
  }
  float d128[16][4];
  attn::WgmmaFence();
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) attn::WgmmaRS_N128<1>(d128, a[jj], attn::DescMn(s_y, jj), jj > 0);
  attn::WgmmaCommit();
  attn::WgmmaWait<0>();
  attn::FenceRegs(d128);
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) attn::FenceRegs(a[jj]);
  Store<128>(d128, c2, 128, 0);

#pragma unroll
  for (int panel = 0; panel < 2; ++panel) {
    attn::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      attn::WgmmaSS_N64<1, 1>(d64, attn::DescMn(s_z, kk), attn::DescMn(s_x + panel * 64 * 64, kk),
                              kk > 0);
    }
    attn::WgmmaCommit();
    attn::WgmmaWait<0>();
    attn::FenceRegs(d64);
    Store<64>(d64, c3, 128, panel * 64);
  }
#endif
}

}  // namespace

int RunWgmmaCheck(const void* x, const void* y, const void* z, float* c1, float* c2, float* c3) {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major != 9) {
    return -1;
  }
  WgmmaCheckKernel<<<1, 128>>>(static_cast<const bf16*>(x), static_cast<const bf16*>(y),
                               static_cast<const bf16*>(z), c1, c2, c3);
  const cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? static_cast<int>(e) : static_cast<int>(cudaDeviceSynchronize());
}

}  // namespace dflash::kernels::testing

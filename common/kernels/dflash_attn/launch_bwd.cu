#include <cuda_runtime.h>

#include <algorithm>

#include "common/kernels/dflash_attn/bwd_kernel.cuh"
#include "common/kernels/dflash_attn/bwd_kernel_sm90.cuh"

namespace dflash::kernels {
namespace {

template <typename Kernel>
int LaunchKernel(Kernel* kernel, int smem, int col_splits, const DflashAttnBwdParams& p,
                 cudaStream_t stream) {
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  const dim3 grid(static_cast<unsigned>(p.n_items), static_cast<unsigned>(p.hkv),
                  static_cast<unsigned>(col_splits));
  kernel<<<grid, 128, smem, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

template <int D>
int Launch(const DflashAttnBwdParams& p, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.q_rows) * p.hq;
  if (rows > 0) {
    attn::DflashAttnDeltaKernel<D><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(
        static_cast<const attn::bf16*>(p.o), static_cast<const attn::bf16*>(p.dout), p.delta, rows);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  if (p.n_items > 0) {
    // wgmma on compute capability 9.0 (DFLASH_ATTN_BWD_KERNEL=mma: the mma.sync kernel instead,
    // which has no head dim 256).
    const bool sm90 = attn::UseSm90Kernels(D == 256 ? nullptr : "DFLASH_ATTN_BWD_KERNEL");
    int e = -1;
    if (sm90) {
      e = LaunchKernel(attn::DflashAttnBwdSm90Kernel<D>, attn::BwdSm90SmemBytes<D>(),
                       D / attn::BwdSm90Cols<D>(), p, stream);
    } else if constexpr (D <= 128) {
      e = LaunchKernel(attn::DflashAttnBwdKernel<D>, attn::BwdSmemBytes<D>(), 1, p, stream);
    }
    if (e != 0) return e;
  }
  const int64_t n4 = rows * D / 4;
  if (n4 > 0) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n4 + 255) / 256, 65535));
    attn::DflashAttnDqKernel<<<blocks, 256, 0, stream>>>(
        reinterpret_cast<const float4*>(p.dq_accum), static_cast<uint2*>(p.dq), n4, p.scale);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchDflashAttnBwd(const DflashAttnBwdParams& p, void* stream) {
  const int group = p.hkv > 0 ? p.hq / p.hkv : 0;
  if (group < 1 || group > 64 || p.hq % p.hkv != 0) return -1;
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.head_dim) {
    case 64:
      return Launch<64>(p, s);
    case 128:
      return Launch<128>(p, s);
    case 256:
      return Launch<256>(p, s);
    default:
      return -1;
  }
}

}  // namespace dflash::kernels

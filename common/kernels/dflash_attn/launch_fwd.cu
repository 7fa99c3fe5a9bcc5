#include <cuda_runtime.h>

#include "common/kernels/dflash_attn/fwd_kernel.cuh"
#include "common/kernels/dflash_attn/fwd_kernel_sm90.cuh"

namespace dflash::kernels {
namespace {

template <typename Kernel>
int LaunchKernel(Kernel* kernel, int smem, const DflashAttnFwdParams& p, cudaStream_t stream) {
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  const dim3 grid(static_cast<unsigned>(p.n_items), static_cast<unsigned>(p.hkv));
  kernel<<<grid, 128, smem, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

template <int D, bool kCausal>
int Launch(const DflashAttnFwdParams& p, cudaStream_t stream) {
  // wgmma for head dims 64 and 128 on compute capability 9.0 (DFLASH_ATTN_FWD_KERNEL=mma: off).
  if constexpr (D <= 128) {
    if (attn::UseSm90Kernels("DFLASH_ATTN_FWD_KERNEL")) {
      return LaunchKernel(attn::DflashAttnFwdSm90Kernel<D, kCausal>, attn::FwdSm90SmemBytes<D>(), p,
                          stream);
    }
  }
  return LaunchKernel(attn::DflashAttnFwdKernel<D, kCausal>, attn::FwdSmemBytes<D>(), p, stream);
}

template <bool kCausal>
int LaunchCausal(const DflashAttnFwdParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return Launch<64, kCausal>(p, stream);
    case 128:
      return Launch<128, kCausal>(p, stream);
    case 256:
      return Launch<256, kCausal>(p, stream);
    default:
      return -1;
  }
}

}  // namespace

int LaunchDflashAttnFwd(const DflashAttnFwdParams& p, void* stream) {
  const int group = p.hkv > 0 ? p.hq / p.hkv : 0;
  if (group < 1 || group > 64 || p.hq % p.hkv != 0) return -1;
  if (p.n_items == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  return p.causal ? LaunchCausal<true>(p, s) : LaunchCausal<false>(p, s);
}

}  // namespace dflash::kernels

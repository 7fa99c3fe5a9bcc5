#include <cuda_runtime.h>

#include "common/kernels/dflash_attn/fwd_kernel.cuh"

namespace dflash::kernels {
namespace {

template <int D, bool kCausal>
int Launch(const DflashAttnFwdParams& p, cudaStream_t stream) {
  constexpr int kSmem = attn::FwdSmemBytes<D>();
  auto* kernel = attn::DflashAttnFwdKernel<D, kCausal>;
  if (kSmem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  const dim3 grid(static_cast<unsigned>(p.n_items), static_cast<unsigned>(p.hkv));
  kernel<<<grid, 128, kSmem, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
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
  if (group < 1 || group > 64 || (group & (group - 1)) != 0 || p.hq % p.hkv != 0) return -1;
  if (p.n_items == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  return p.causal ? LaunchCausal<true>(p, s) : LaunchCausal<false>(p, s);
}

}  // namespace dflash::kernels

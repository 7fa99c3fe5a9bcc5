// DFlash2's grouped dynamic causal convolution over each block's slots (docs/method.md §2.2) on
// CUDA: one kernel forward, three backward (block_conv_launch.cu), differentiable in x, delta and
// base. The reference it replaces on the GPU is LibTorch's composition in
// common/drafter/dflash2.cc (BlockConvolution: per tap a shifted copy, a broadcast coefficient
// and a product, each a pass over [rows, H], and as many again in autograd's backward), which
// stays the CPU path; tests/kernels/block_conv_gpu_test.cc compares the two.
// DFLASH_FUSED_BLOCK_CONV=0 in the environment keeps the composition (benchmarks measure both in
// one build).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::kernels {

// Whether DFLASH_FUSED_BLOCK_CONV leaves the kernels on (it is not "0").
bool FusedBlockConvEnabled();

// Whether the kernels take these (and the variable leaves them on): x [rows, H] and delta
// [rows, K, G] CUDA tensors of one dtype (fp32, bf16, fp16) on one device, base [K, H] there in
// fp32 or that dtype (the kernels read it in fp32),
// rows a multiple of block_size, H = G * group_size, K <= block_size.
bool SupportsFusedBlockConv(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& base,
                            int64_t block_size, int64_t group_size);

// out[r, c] = sum over taps t <= slot(r) of x[r - t, c] * (base[t, c] + delta[r, t, c / group]),
// differentiable in x, delta and base (params.h has the backward's sums). TORCH_CHECKs what
// SupportsFusedBlockConv requires.
at::Tensor FusedBlockConvolution(const at::Tensor& x, const at::Tensor& delta,
                                 const at::Tensor& base, int64_t block_size, int64_t group_size);

}  // namespace dflash::kernels

// The environment switches that change which kernels a worker runs (for comparisons in
// benchmarks; docs/models.md): DFLASH_FUSED_ROPE=0 (RoPE as the ATen composition instead of the
// fused kernel), DFLASH_FUSED_QK_NORM_ROPE=0 (a target's q / k norm and RoPE as two ops),
// DFLASH_CUDNN_ATTN_MIN_TOKENS (a target's documents of that many tokens or more through cuDNN's
// attention instead of flash varlen; 0: none),
// DFLASH_FUSED_SWIGLU=0 (the MLPs' silu(g) * u, the drafter's gradients too, as ATen
// kernels), DFLASH_FUSED_BLOCK_CONV=0 (DFlash2's block convolutions as ATen's composition),
// DFLASH_ATTN_FWD_KERNEL=mma and DFLASH_ATTN_BWD_KERNEL=mma (the mma.sync attention
// kernels instead of wgmma). A worker that runs a run with any of them set reports them with its
// settings echo ("kernel_overrides"), and the coordinator records them in the run's start event,
// so that no run's figures silently come from other kernels.
#pragma once

#include <string>

namespace dflash::worker {

inline constexpr const char* kKernelOverrideVariables[] = {
    "DFLASH_FUSED_ROPE",           "DFLASH_FUSED_QK_NORM_ROPE", "DFLASH_FUSED_SWIGLU",
    "DFLASH_FUSED_BLOCK_CONV",     "DFLASH_ATTN_FWD_KERNEL",    "DFLASH_ATTN_BWD_KERNEL",
    "DFLASH_CUDNN_ATTN_MIN_TOKENS"};

// "NAME=value ..." of the switches set in this process's environment, "" when none is.
std::string KernelOverrides();

}  // namespace dflash::worker

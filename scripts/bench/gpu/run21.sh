#!/usr/bin/env bash
# Device run 21: the wgmma attention kernels at 25638ff. The GPU tests (wgmma_gpu_test,
# dflash_attn_gpu_test), the previous mma.sync kernels (DFLASH_ATTN_FWD_KERNEL=mma
# DFLASH_ATTN_BWD_KERNEL=mma) at 8192 / 512 and 16384 / 1024 context tokens / anchors, the causal
# varlen forward with the mma.sync forward and with the wgmma forward, then ours (wgmma) against
# compiled FlexAttention (dflash_attn.sh, eager Flex skipped).
# Cited in: docs/benchmarks.md, "Causal varlen forward (the target's attention) on one H200" (the
# 25638ff table); the same call gives the 25638ff rows of "Hopper kernels (wgmma): the 1.3x target
# met (2026-12-04)".
# Recorded: 2026-12-04, 25638ff, one NVIDIA H200, Release build.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: that device run 21 ran the command block of "Hopper kernels (wgmma)" (the causal
# section says "same binary" and its two flash varlen columns are the block's two causal_attn
# runs); the block's "# and 16384 / 1024" is written out as a second dflash_attn run.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log, Flex's files in
# $OUT/flex.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b \
  "wgmma_gpu_test dflash_attn_gpu_test dflash_attn causal_attn" \
  bash scripts/bench/gpu/run21.sh steps
# Inside device_run.sh (BUILD exported):
"$BUILD/tests/kernels/wgmma_gpu_test"
"$BUILD/tests/kernels/dflash_attn_gpu_test"
for geom in 8192:512 16384:1024; do
  DFLASH_ATTN_FWD_KERNEL=mma DFLASH_ATTN_BWD_KERNEL=mma \
    "$BUILD/scripts/bench/dflash_attn" --context "${geom%:*}" --anchors "${geom#*:}"
done
DFLASH_ATTN_FWD_KERNEL=mma "$BUILD/scripts/bench/causal_attn"
"$BUILD/scripts/bench/causal_attn"
DFLASH_FLEX_ARGS=--skip-eager PYTHON=/opt/torch/.venv/bin/python3 \
  scripts/bench/dflash_attn.sh "$BUILD" "$OUT/flex"

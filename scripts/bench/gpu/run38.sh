#!/usr/bin/env bash
# Device run 38: the drafter step at 8192 / 512 tokens / anchors with the fused RoPE kernel
# (DFLASH_FUSED_ROPE=1) and with LibTorch's composition (DFLASH_FUSED_ROPE=0), twice each,
# alternating; then the GPU tests through ApplyRope (TargetModelGpuTest, HybridTargetGpuTest,
# TensorParallelGpu, DrafterGpu, SpeculativeGpuTest, TrainingCluster.GpuPair*, RopeGpu).
# Cited in: docs/benchmarks-training.md, "Fused RoPE (2026-12-04, main at adf023b)" (the table and
# the GPU tests).
# Recorded: 2026-12-04, main at adf023b, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the order (measurements first, then the tests: a failing test would end the call), the
# tests run through ctest -R on the names the docs give. RopeGpu.MatchesTheAtenComposition... failed
# at adf023b on a test bug fixed in 41d6944 (device run 39). Build type not recorded:
# device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b \
  "drafter_step nn_gpu_test drafter_gpu_test spec_gpu_test training_gpu_test rope_gpu_test" \
  bash scripts/bench/gpu/run38.sh steps
# Inside device_run.sh (BUILD exported):
for round in 1 2; do
  for fused in 1 0; do
    echo "== round $round, DFLASH_FUSED_ROPE=$fused"
    DFLASH_FUSED_ROPE=$fused "$BUILD/scripts/bench/drafter_step" --tokens 8192 --anchors 512
  done
done
ctest --test-dir "$BUILD" -R 'TargetModelGpuTest|HybridTargetGpuTest|TensorParallelGpu|'\
'DrafterGpu|SpeculativeGpuTest|TrainingCluster.GpuPair|RopeGpu'

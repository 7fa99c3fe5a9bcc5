#!/usr/bin/env bash
# Device run 36: the drafter step (ours) at 8192 / 512 tokens / anchors with drafter.recompute none
# and mlp and the kernel profile, the GPU tests of the changed embedding path (DrafterGpu,
# SpeculativeGpuTest, TrainingCluster.GpuPair*), then the PyTorch reference at 8192 / 512.
# Cited in: docs/benchmarks-training.md, "Host-side stalls removed from the drafter step
# (2026-12-04, main at 98bab41)" (the table and the GPU tests).
# Recorded: 2026-12-04, main at 98bab41, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the elided build and output folders ("...") as /tmp/b and $OUT/ds_MODE (as in device
# runs 28 and 31), the reference's command (GEOMS=8192:512 PHASES=ref into $OUT/ds_none), the
# tests run through ctest -R on their names, PYTHON=/opt/torch/.venv/bin/python3 (the reference's
# interpreter, from the command recorded in "Drafter training step against a PyTorch reference on
# one H200"). Build type not recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log, the JSON in
# $OUT/ds_MODE.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b \
  "drafter_step drafter_gpu_test spec_gpu_test training_gpu_test" \
  bash scripts/bench/gpu/run36.sh steps
# Inside device_run.sh (BUILD exported):
for mode in none mlp; do
  OURS_ARGS="--recompute $mode --profile 1" GEOMS=8192:512 PHASES=ours \
    scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds_$mode"
done
ctest --test-dir "$BUILD" -R 'DrafterGpu|SpeculativeGpuTest|TrainingCluster.GpuPair'
GEOMS=8192:512 PHASES=ref scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds_none"

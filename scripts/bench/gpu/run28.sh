#!/usr/bin/env bash
# Device run 28: the drafter step (ours) with drafter.recompute none, mlp and layers at 8192 / 512
# and 16384 / 1024 tokens / anchors, then the PyTorch reference at 8192 / 512.
# Cited in: docs/benchmarks-training.md, "Drafter step against the PyTorch reference (one H200,
# main at cfbd788)" (under "Memory-lean drafter ops and `drafter.recompute` (2026-12-04)").
# Recorded: 2026-12-04, main at cfbd788, one NVIDIA H200, Release build of drafter_step.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: PYTHON=/opt/torch/.venv/bin/python3 (the reference's interpreter, from the command
# recorded in "Drafter training step against a PyTorch reference on one H200").
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log, the JSON in
# $OUT/ds_MODE.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b drafter_step \
  bash scripts/bench/gpu/run28.sh steps
# Inside device_run.sh (BUILD exported):
for mode in none mlp layers; do
  OURS_ARGS="--recompute $mode" PHASES=ours scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds_$mode"
done
GEOMS=8192:512 PHASES=ref scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds_none"

#!/usr/bin/env bash
# Device run 31: the drafter step with a kernel profile (--profile 1). Ours at 8192 / 512 tokens /
# anchors with drafter.recompute none, mlp and layers, ours at 16384 / 1024 with mlp and layers,
# then the PyTorch reference at 8192 / 512 with its profile.
# Cited in: docs/benchmarks-training.md, "Drafter step re-measured, with a kernel profile
# (2026-12-04, main at 4c061f3 + d99c625)" and its "Where the step's time goes" table.
# Recorded: 2026-12-04, main at 4c061f3 + d99c625, one NVIDIA H200, Release build of drafter_step;
# device run 32 (scripts/bench/gpu/run32.sh) followed in the same lease.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the reference's elided arguments ("...") as /tmp/b and $OUT/ds_none (as in device run
# 28); PYTHON=/opt/torch/.venv/bin/python3 (the reference's interpreter, from the command recorded
# in "Drafter training step against a PyTorch reference on one H200").
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log, the JSON in
# $OUT/ds_MODE.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b drafter_step \
  bash scripts/bench/gpu/run31.sh steps
# Inside device_run.sh (BUILD exported):
for mode in none mlp layers; do
  OURS_ARGS="--recompute $mode --profile 1" GEOMS=8192:512 PHASES=ours \
    scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds_$mode"
done
for mode in mlp layers; do
  "$BUILD/scripts/bench/drafter_step" --tokens 16384 --anchors 1024 --recompute "$mode" --profile 1
done
GEOMS=8192:512 PHASES=ref REF_ARGS="--profile 1" \
  scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds_none"

#!/usr/bin/env bash
# Device run 32: the drafter step at 16384 / 1024 tokens / anchors, ours (recompute none) then the
# PyTorch reference, both with the kernel profile (--profile 1).
# Cited in: docs/benchmarks-training.md, "Drafter step re-measured, with a kernel profile
# (2026-12-04, main at 4c061f3 + d99c625)" and its "Where the step's time goes" table.
# Recorded: 2026-12-04, main at 4c061f3 + d99c625, one NVIDIA H200, in the same lease after device
# run 31 (scripts/bench/gpu/run31.sh), Release build of drafter_step.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: PYTHON=/opt/torch/.venv/bin/python3 (the reference's interpreter, from the command
# recorded in "Drafter training step against a PyTorch reference on one H200").
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log, the JSON in
# $OUT/ds.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b drafter_step \
  env GEOMS=16384:1024 OURS_ARGS="--profile 1" REF_ARGS="--profile 1" \
  PYTHON="${PYTHON:-/opt/torch/.venv/bin/python3}" scripts/bench/drafter_step.sh /tmp/b "$OUT/ds"

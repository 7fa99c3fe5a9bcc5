#!/usr/bin/env bash
# Device run 35: the drafter step (ours) at 8192 / 512 tokens / anchors with the kernel profile,
# which lists the device's idle intervals and the host's ATen ops during each (where the 4.07 ms
# stall at the start of every forward was found).
# Cited in: docs/benchmarks-training.md, "Host-side stalls removed from the drafter step
# (2026-12-04, main at 98bab41)" (first paragraph).
# Recorded: 2026-12-04, main at 461396b, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the docs name `drafter_step --profile 1` only; the command below is device run 36's
# form of it for recompute none (OURS_ARGS, GEOMS, PHASES=ours), with the output folder $OUT/ds.
# Build type not recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b drafter_step \
  env OURS_ARGS="--profile 1" GEOMS=8192:512 PHASES=ours \
  scripts/bench/drafter_step.sh /tmp/b "$OUT/ds"

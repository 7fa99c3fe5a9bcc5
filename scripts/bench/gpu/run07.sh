#!/usr/bin/env bash
# Device run 7: the training pipeline on one GPU at seven configurations (tokens:anchors:drafter
# layers), 10 steps each, both workers on GPU 0 through cuda_ipc: step time, context tokens/s,
# each process's peak and reserved memory.
# Cited in: docs/benchmarks-training.md, "Training pipeline at seven configurations on one H200
# (2026-12-03, main at 02dbbf5)".
# Recorded: 2026-12-03, main at 02dbbf5, one NVIDIA H200, the same lease (and Release build) as
# device run 6's 02dbbf5 call (scripts/bench/gpu/run06.sh).
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the build targets (the four programs pipeline.sh starts).
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b \
  "dflash-coordinator dflash-target-worker dflash-drafter-worker dflashctl" \
  env GEOMS="8192:512:5 16384:1024:5 4096:256:5 8192:512:1 8192:256:5 8192:1024:5 16384:1024:1" \
  scripts/bench/pipeline.sh /tmp/b 10 "$OUT/pl"

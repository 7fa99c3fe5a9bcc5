#!/usr/bin/env bash
# Device run 27: the training pipeline on one GPU with drafter.recompute mlp and layers at
# 8192 / 512 and 16384 / 1024 tokens / anchors, 5-layer drafter, 10 steps each, both workers on
# GPU 0 through cuda_ipc: step time, context tokens/s, each process's peak memory.
# Cited in: docs/benchmarks-training.md, "The pipeline with the lean ops (one H200, main at
# e1a13af / cfbd788)".
# Recorded: 2026-12-04, code of cfbd788, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the recorded command is `scripts/bench/pipeline.sh /tmp/b 10`; GEOMS is the table's
# four recompute rows (whether this call also re-ran the seven rows of device run 26 is not
# recorded). The build targets (the four programs pipeline.sh starts). Build type not recorded:
# device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b \
  "dflash-coordinator dflash-target-worker dflash-drafter-worker dflashctl" \
  env GEOMS="8192:512:5:mlp 8192:512:5:layers 16384:1024:5:mlp 16384:1024:5:layers" \
  scripts/bench/pipeline.sh /tmp/b 10

#!/usr/bin/env bash
# Device run 26: the training pipeline on one GPU with the lean drafter ops, at the seven
# configurations of device run 7 (tokens:anchors:drafter layers), 10 steps each, both workers on
# GPU 0 through cuda_ipc: step time, context tokens/s, each process's peak memory.
# Cited in: docs/benchmarks-training.md, "The pipeline with the lean ops (one H200, main at
# e1a13af / cfbd788)".
# Recorded: 2026-12-04, drafter code at e1a13af, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the recorded command is `scripts/bench/pipeline.sh /tmp/b 10`; GEOMS is the table's
# seven rows without recompute (e1a13af predates drafter.recompute and pipeline.sh's recompute
# field, both cfbd788; device run 27 has the recompute rows). The build targets (the four programs
# pipeline.sh starts). Build type not recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b \
  "dflash-coordinator dflash-target-worker dflash-drafter-worker dflashctl" \
  env GEOMS="8192:512:5 16384:1024:5 4096:256:5 8192:512:1 8192:256:5 8192:1024:5 16384:1024:1" \
  scripts/bench/pipeline.sh /tmp/b 10

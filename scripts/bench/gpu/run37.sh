#!/usr/bin/env bash
# Device run 37: scripts/bench/multi_gpu.sh on one GPU, 20 steps: only its first part runs (target
# and drafter on GPU 0 through cuda_ipc, the 8B-shaped target, 8192 tokens / 512 anchors, 5-layer
# drafter: step time, tokens/s, loss curve); the other parts print "skipped (1 GPU)".
# Cited in: docs/benchmarks-training.md, "The multi-GPU script on one GPU (2026-12-04, main at
# 58e8ebc)".
# Recorded: 2026-12-04, main at 58e8ebc, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the build targets (the four programs multi_gpu.sh starts, and transport_bench, which it
# runs on two GPUs or more). multi_gpu.sh has changed since 58e8ebc (deadlines on its waits,
# MAX_REL_DIFF, the kill part); its one-GPU part runs the same run. Build type not recorded:
# device_run.sh's default, Release. The output folder is /tmp/mg as recorded; its JSON lines are
# also in $OUT/log.
# Run from a checkout on the GPU machine with OUT set.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b \
  "dflash-coordinator dflash-target-worker dflash-drafter-worker dflashctl transport_bench" \
  env STEPS=20 scripts/bench/multi_gpu.sh /tmp/b /tmp/mg

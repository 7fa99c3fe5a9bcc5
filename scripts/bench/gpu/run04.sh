#!/usr/bin/env bash
# Device run 4: the training pipeline on one GPU at 8192 tokens / 512 anchors, 12 steps (target
# running one step ahead of the drafter), then the GPU tests of that lease: the NCCL communicator
# on one rank, the worker's /metrics memory series, the shared-memory ring, the host communicator
# and training_gpu_test.
# Cited in: docs/benchmarks-training.md, "Training pipeline on one H200 (GPU targets) — partial"
# (the paragraphs "Later the same day, main at 30b2bc7" and "GPU tests in that lease").
# Recorded: 2026-12-03, main at 30b2bc7, one NVIDIA H200, Release build.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the build targets (what the commands need) and the order (pipeline first, tests after).
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b \
  "dflash-coordinator dflash-target-worker dflash-drafter-worker dflashctl
   nccl_communicator_gpu_test worker_metrics_gpu_test shm_ring_test host_communicator_test
   training_gpu_test" \
  bash scripts/bench/gpu/run04.sh steps
# Inside device_run.sh (BUILD exported):
GEOMS=8192:512 scripts/bench/pipeline.sh "$BUILD" 12
for t in transport/nccl_communicator_gpu_test worker/worker_metrics_gpu_test \
         transport/shm_ring_test transport/host_communicator_test integration/training_gpu_test; do
  "$BUILD/tests/$t"
done

#!/usr/bin/env bash
# Device run 13 (run 14 and run 15 are the same call at later revisions): the Qwen3.5-27B-shaped
# hybrid target's forward at 8192 and 16384 packed tokens (features/s, peak above the weights) and
# the delta-rule scan alone per layer (CUDA kernels and the ATen path), after nn_gpu_test (the delta
# rule on CUDA and the tiny hybrid checkpoints against transformers).
# Cited in: docs/benchmarks.md, "Qwen3.5-27B-shaped hybrid target forward on one H200 (the hybrid
# shape)" ("device run 13 .. 15", one device call per revision).
# Recorded: 2026-12-04, one NVIDIA H200; the table's revisions in the order measured: 7d1a598,
# 32eee5b, e68590f, c6ee2fc. Device run 13 measured 7d1a598 (an earlier version of the section,
# commit fa3e43f, named runs 13 and 14 for its two revisions, 7d1a598 and 32eee5b).
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the test binary is run directly (the docs say "run nn_gpu_test"). Build type not
# recorded: device_run.sh's default, Release.
# Run from a checkout of the revision on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b "nn_gpu_test target_forward" \
  bash scripts/bench/gpu/run13.sh steps
# Inside device_run.sh (BUILD exported):
"$BUILD/tests/nn/nn_gpu_test"
"$BUILD/scripts/bench/target_forward" --model qwen3.5-27b --runs 5 --tokens 8192
"$BUILD/scripts/bench/target_forward" --model qwen3.5-27b --runs 5 --tokens 16384

#!/usr/bin/env bash
# Device run 17: the delta-rule scan alone per layer (the mix and one document, 8192 tokens) of the
# Qwen3.5-27B shape, run on a variant of the recurrence kernel that read W, Q, A and K from global
# memory instead of staging them in shared memory (slower: 4.25 -> 5.64 ms on the mix, 5.03 ->
# 9.45 ms on one document; dropped).
# Cited in: docs/benchmarks.md, "Qwen3.5-27B-shaped hybrid target forward on one H200 (the hybrid
# shape)" ("Tried and dropped").
# Recorded: 2026-12-04, on the working tree after 9020df9 (the variant, never committed), one
# NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# NOT the original code: the variant kernel was never committed and no longer exists. This runs
# the closest equivalent in the tree, the scan table of the committed kernel (the one that stages
# in shared memory, the 4.25 / 5.03 ms side of the comparison).
# Inferred: the command (`target_forward --model qwen3.5-27b --runs 5 --scan_only 1`; the docs
# give the figures, not the command; --runs 5 as in device runs 13 .. 15). Build type not
# recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b target_forward \
  /tmp/b/scripts/bench/target_forward --model qwen3.5-27b --runs 5 --scan_only 1

#!/usr/bin/env bash
# Device run 14: the same call as device run 13 (scripts/bench/gpu/run13.sh, which this runs): the
# Qwen3.5-27B-shaped hybrid forward at 8192 and 16384 tokens and the delta-rule scan alone, after
# nn_gpu_test.
# Cited in: docs/benchmarks.md, "Qwen3.5-27B-shaped hybrid target forward on one H200 (the hybrid
# shape)" ("device run 13 .. 15").
# Recorded: 2026-12-04, one NVIDIA H200; device run 14 measured 32eee5b (an earlier version of the
# section, commit fa3e43f, named runs 13 and 14 for its two revisions, 7d1a598 and 32eee5b).
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Run from a checkout of the revision on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
exec "$(dirname "$0")/run13.sh" "$@"

#!/usr/bin/env bash
# Device run 15: the same call as device run 13 (scripts/bench/gpu/run13.sh, which this runs): the
# Qwen3.5-27B-shaped hybrid forward at 8192 and 16384 tokens and the delta-rule scan alone, after
# nn_gpu_test.
# Cited in: docs/benchmarks.md, "Qwen3.5-27B-shaped hybrid target forward on one H200 (the hybrid
# shape)" ("device run 13 .. 15").
# Recorded: 2026-12-04, one NVIDIA H200, at the table's later revisions (e68590f, c6ee2fc). The
# docs name three runs (13 .. 15) for four revisions; which of the last two device run 15 measured,
# and which call measured the other, is not recorded.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Run from a checkout of the revision on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
exec "$(dirname "$0")/run13.sh" "$@"

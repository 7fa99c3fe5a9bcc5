#!/usr/bin/env bash
# Device run 5: every gpu-labelled test (ctest -L gpu) after a full Release build.
# Cited in: docs/benchmarks-training.md, "Training pipeline at seven configurations on one H200
# (2026-12-03, main at 02dbbf5)" (the paragraph "GPU tests in the same session").
# Recorded: 2026-12-03, main at 05f4a88, one NVIDIA H200, Release build.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the build target `all` ("Release build" with every gpu-labelled test binary).
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b all ctest --test-dir /tmp/b -L gpu

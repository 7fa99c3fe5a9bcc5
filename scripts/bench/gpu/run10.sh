#!/usr/bin/env bash
# Device run 10: every gpu-labelled test (ctest -L gpu), spec_gpu_test and training_gpu_test
# among them.
# Cited in: docs/benchmarks.md, "Speculative decoding with a drafter the system trained, on one
# H200" (the paragraph "GPU tests at 67a58ce").
# Recorded: 2026-12-03, revision 67a58ce, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the build target `all` (every gpu-labelled test binary). Build type not recorded:
# device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b all ctest --test-dir /tmp/b -L gpu

#!/usr/bin/env bash
# Device run 39: rope_gpu_test, the fused RoPE kernel and LibTorch's composition against an fp32
# computation from the same inputs (bf16, fp16, fp32; head dims 64/128/256): each one's worst
# relative error, printed by the test.
# Cited in: docs/benchmarks-training.md, "Fused RoPE (2026-12-04, main at adf023b)" (the error
# figures and "passed in the next call").
# Recorded: 2026-12-04, at 41d6944, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the test binary run directly. Build type not recorded: device_run.sh's default,
# Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b rope_gpu_test /tmp/b/tests/kernels/rope_gpu_test

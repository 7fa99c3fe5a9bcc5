#!/usr/bin/env bash
# drafter.precision: fp8 on the GPU (docs/benchmarks-training.md, "fp8 projections"): the fp8 GPU
# tests (cuBLASLt's scaled matmul against the CPU emulation; the fp8 drafter on CUDA against the
# CPU), then the drafter step at the Qwen3-8B drafter shape (5 layers, 8192 tokens, 512 anchors)
# in bf16 and in fp8 (20 timed steps each), then 300 steps of each on the same batch and seed for
# the loss curves (compared every 10th step by scripts/bench/fp8_losses.py on the CPU machine).
# From binaries built on the CPU machine (scripts/bench/gpu/gpu_tests.sh pack; carry .devdeps
# .gpu/t); results in $OUT/fp8.
set -uo pipefail
cd "$(dirname "$0")/../../.."
# The benchmarks link LibTorch and the Debian libraries of .devdeps (gpu_tests.sh's run sets these
# for the tests only).
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
export OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT/fp8"
GTEST_FILTER='DrafterGpu.Fp8*:Fp8QuantGpu.*' OUT="$OUT/fp8" bash scripts/bench/gpu/gpu_tests.sh run 'drafter_gpu|fp8_quant'
step=build/scripts/bench/drafter_step
for p in auto fp8; do
  "$step" --tokens 8192 --anchors 512 --steps 20 --precision "$p" --json "$OUT/fp8/step_$p.json" \
    2>&1 | tail -3 | tee -a "$OUT/fp8/log"
done
for p in auto fp8; do
  "$step" --tokens 8192 --anchors 512 --steps 300 --warmup 0 --precision "$p" \
    --json "$OUT/fp8/curve_$p.json" 2>&1 | tail -2 | tee -a "$OUT/fp8/log"
done

#!/usr/bin/env bash
# Device run 41 (2026-12-07): the new CUDA code's GPU tests and measurements, from binaries built
# on the CPU machine (`scripts/bench/gpu/gpu_tests.sh pack 'dflash_attn|fp8_quant|drafter_gpu'`;
# carry .devdeps .gpu/t; about 4 minutes):
#   1. dflash_attn_gpu_test (sliding-window layers in the fused kernels against the reference),
#      fp8_quant_gpu_test (the quantization kernels against the CPU reference, bit for bit),
#      drafter_gpu_test (fp8 GEMMs against the emulation, the fp8 drafter on CUDA against the CPU,
#      the attention kernel report);
#   2. scripts/bench/gpu/sliding_window.sh: the fused attention's time by window;
#   3. the drafter step at 8192 / 512 / 5 layers in bf16 and in fp8, 10 timed steps each.
# Run from a checkout on the GPU machine with OUT set; results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
bash scripts/bench/gpu/gpu_tests.sh run 'dflash_attn|fp8_quant|drafter_gpu'
bash scripts/bench/gpu/sliding_window.sh
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
mkdir -p "$OUT/fp8"
for p in auto fp8; do
  timeout 120 build/scripts/bench/drafter_step --tokens 8192 --anchors 512 --steps 10 \
    --precision "$p" --json "$OUT/fp8/step_$p.json" 2>&1 | tail -3 | tee -a "$OUT/fp8/log"
done

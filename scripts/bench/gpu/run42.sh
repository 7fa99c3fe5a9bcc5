#!/usr/bin/env bash
# Device run 42 (2026-12-07): what runs 40 and 41 prepared and never ran, in three device calls on
# one warm machine, from binaries built on the CPU machine
# (`scripts/bench/gpu/gpu_tests.sh pack 'dflash_attn|fp8_quant|drafter_gpu|memory_gpu|nn_gpu'`;
# carry .devdeps .gpu/t; 26.6 MB at acb7f25):
#   run42.sh 1: scripts/bench/gpu/run41.sh (the sliding-window and fp8 kernels' GPU tests, the
#               attention's time by window, the drafter step in bf16 and fp8);
#   run42.sh 2: memory_gpu_test's drafter out-of-memory case (issue 26 b, since relaxed), the
#               draft cache at batch 1 / 16 / 64, nn_gpu_test (the target's kernel report, tensor
#               parallel);
#   run42.sh 3: the rest of memory_gpu_test (a run beside another process, the plan against the
#               measured peaks, 65536 tokens), then the 300-step bf16 / fp8 loss curves.
# Each part stays under a device call's 600 s: every step has its own timeout. Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
part=${1:?usage: run42.sh 1|2|3}
unpacked() { [ -x build/tests/drafter/drafter_gpu_test ] || bash scripts/bench/gpu/gpu_tests.sh run '^$'; }
benv() { set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
         export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64; }
case "$part" in
  1) timeout 560 bash scripts/bench/gpu/run41.sh ;;
  2) unpacked; mkdir -p "$OUT/oom"
     OUT="$OUT/oom" GTEST_FILTER='MemoryGpu.TheDrafter*' timeout 240 \
       bash scripts/bench/gpu/gpu_tests.sh run memory_gpu_test
     benv
     for b in 1 16 64; do
       timeout 60 build/scripts/bench/draft_cache --batch "$b" --prompt 1024 --accept 4 --blocks 64 \
         --warmup 4 --json "$OUT/draft_cache_b$b.json" 2>&1 | tail -5 | tee -a "$OUT/log"
     done
     mkdir -p "$OUT/nn"
     OUT="$OUT/nn" timeout 150 bash scripts/bench/gpu/gpu_tests.sh run nn_gpu ;;
  3) unpacked; mkdir -p "$OUT/mem"
     OUT="$OUT/mem" GTEST_FILTER='MemoryGpu.ARunBeside*:MemoryGpu.ThePlan*:MemoryGpu.SixtyFourK*' \
       timeout 330 bash scripts/bench/gpu/gpu_tests.sh run memory_gpu_test
     benv; mkdir -p "$OUT/fp8"
     for p in auto fp8; do
       timeout 110 build/scripts/bench/drafter_step --tokens 8192 --anchors 512 --steps 300 \
         --warmup 0 --precision "$p" --json "$OUT/fp8/curve_$p.json" 2>&1 | tail -2 |
         tee -a "$OUT/fp8/log"
     done ;;
esac

#!/usr/bin/env bash
# Device run 44 (prepared 2026-12-07 after run 43): the fp8 columns' 16-byte kernels, the shared
# input projections (SharedInputLinear; in fp8 one quantization per shared input) and where the
# fp8 and bf16 steps' time goes with them (against run 43's 148.5 / 145.7 ms), then the planner against the allocator's peaks at this revision
# (it failed at cdbc92a: the drafter +10.7% at 16384 / 1024 recompute mlp; the drafter's plan
# since rewritten phase by phase from what the code keeps). From binaries built
# on the CPU machine (`scripts/bench/gpu/gpu_tests.sh pack 'fp8_quant|drafter_gpu|memory_gpu'`;
# carry .devdeps .gpu/t):
#   1. fp8_quant_gpu_test (both column paths bit for bit against the CPU reference) and
#      drafter_gpu_test;
#   2. drafter_step --profile 1 at 8192 / 512 in bf16 and fp8 (the categories and the top kernels
#      of each phase in the JSON);
#   3. memory_gpu_test's ThePlan case (the planned and measured peaks at three geometries);
#   4. the drafter's peaks by phase (drafter_step's forward_peak_bytes and backward_peak_bytes) at
#      the planner test's geometries, its 65,536-token one and 32768 / 4096 / recompute layers,
#      to compare with the plan's phases
#      (`dflashctl plan --local` on the CPU machine): what docs/memory.md says is missing to
#      recalibrate the drafter's plan.
# Everything under $OUT, packed into $OUT/run44.tgz after each stage (a call returns few files).
set -uo pipefail
cd "$(dirname "$0")/../../.."
real=${OUT:?set OUT to the folder the results go to}
export OUT=/tmp/r44
rm -rf "$OUT" && mkdir -p "$OUT/t" "$OUT/plan" "$OUT/step"
pack() { tar -czf "$real/run44.tgz.new" -C "$OUT" . 2>/dev/null &&
         mv "$real/run44.tgz.new" "$real/run44.tgz"; cp "$OUT/log" "$real/log"; }
OUT="$OUT/t" timeout 90 bash scripts/bench/gpu/gpu_tests.sh run 'fp8_quant|drafter_gpu'
cat "$OUT/t/log" >>"$OUT/log"
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
for p in fp8 auto; do
  timeout 100 build/scripts/bench/drafter_step --tokens 8192 --anchors 512 --steps 10 \
    --profile 1 --precision "$p" --json "$OUT/step/$p.json" >"$OUT/step/$p.log" 2>&1
  grep -o '"ms_median": [0-9.]*, .*"ms_pipelined": [0-9.]*\|"peak_bytes": [0-9]*' \
    "$OUT/step/$p.json" | tr '\n' ' ' | sed "s/^/[$p] /" >>"$OUT/log"; echo >>"$OUT/log"
done
pack
OUT="$OUT/plan" GTEST_FILTER='MemoryGpu.ThePlan*' timeout 200 \
  bash scripts/bench/gpu/gpu_tests.sh run memory_gpu_test
cat "$OUT/plan/log" >>"$OUT/log"
grep -h "memory_gpu_test\]" "$OUT/plan/"*.log >>"$OUT/log"
pack
mkdir -p "$OUT/phases"
for g in "8192 512 none 5 200 2000" "16384 1024 mlp 5 200 2000" "4096 256 layers 2 200 2000" \
         "65536 2048 none 2 65536 65536" "32768 4096 layers 2 200 2000"; do
  set -- $g
  timeout 120 build/scripts/bench/drafter_step --tokens "$1" --anchors "$2" --recompute "$3" \
    --layers "$4" --doc-min "$5" --doc-max "$6" --steps 3 --warmup 1 \
    --json "$OUT/phases/$1_$3.json" >"$OUT/phases/$1_$3.log" 2>&1
  grep -o '"peak_bytes": [0-9]*\|"forward_peak_bytes": [0-9]*\|"backward_peak_bytes": [0-9]*' \
    "$OUT/phases/$1_$3.json" | tr '\n' ' ' | sed "s/^/[phases $g] /" >>"$OUT/log"; echo >>"$OUT/log"
done
pack

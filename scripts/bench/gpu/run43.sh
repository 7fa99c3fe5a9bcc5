#!/usr/bin/env bash
# Device run 43 (2026-12-07; ran on an H100 from binaries of cdbc92a: the --overlap-optimizer flag
# and trainer_gpu_test it uses were removed after, in 3c3b299), after run 42 (docs/benchmarks.md):
# its failures fixed and re-run,
# and where the fp8 step's time goes. From binaries built on the CPU machine
# (`scripts/bench/gpu/gpu_tests.sh pack 'drafter_gpu|memory_gpu|swiglu|trainer_gpu'`;
# carry .devdeps .gpu/t):
#   1. drafter_gpu_test (the fp8 tests, fixed), swiglu_gpu_test and trainer_gpu_test (the fused
#      SwiGLU and the overlapped optimizer step, new); the drafter step profiled (--profile 1) in
#      bf16 as built, without the optimizer overlap, with the SwiGLU composition, and in fp8;
#   2. memory_gpu_test's drafter out-of-memory case (its margin now 1.5 GiB below the full
#      micro-batch's peak);
#   3. the draft cache at batch 1 / 16 / 64 (its drafter's embedding on "cuda" against "cuda:0");
#   4. scripts/bench/gpu/sliding_window.sh (the reference at 8192 only);
#   5. the raw GEMMs in PyTorch (scripts/bench/fp8_gemm.py: bf16 against _scaled_mm at the
#      projections' shapes).
# In that order, so that a call cut short by too little device time returns the first stages.
# Everything under $OUT, packed into $OUT/run43.tgz (a call returns few files).
set -uo pipefail
cd "$(dirname "$0")/../../.."
# The stages write under /tmp/r43; $OUT gets only run43.tgz and the log, packed after every
# stage, so that a call cut short by its limit still returns what ran.
real=${OUT:?set OUT to the folder the results go to}
export OUT=/tmp/r43
rm -rf "$OUT" && mkdir -p "$OUT/t" "$OUT/oom" "$OUT/fp8"
pack() { tar -czf "$real/run43.tgz.new" -C "$OUT" . 2>/dev/null &&
         mv "$real/run43.tgz.new" "$real/run43.tgz"; cp "$OUT/log" "$real/log"; }
OUT="$OUT/t" timeout 120 bash scripts/bench/gpu/gpu_tests.sh run 'drafter_gpu|swiglu|trainer_gpu'
grep -h "^\[fp8\]\|worst relative" "$OUT/t/"*.log >>"$OUT/log"; cat "$OUT/t/log" >>"$OUT/log"
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
# The drafter step at 8192 / 512, profiled: bf16 as built (fused SwiGLU, optimizer overlapped),
# without the overlap, with the SwiGLU composition (DFLASH_FUSED_SWIGLU=0), and fp8.
variant() {  # NAME ENV... -- FLAGS...
  local name=$1; shift; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 100 build/scripts/bench/drafter_step --tokens 8192 --anchors 512 \
    --steps 10 --profile 1 "$@" --json "$OUT/fp8/step_$name.json" >"$OUT/fp8/step_$name.log" 2>&1
  grep -o '"ms_median": [0-9.]*, .*"optimizer_overlap": [a-z]*\|"peak_bytes": [0-9]*' \
    "$OUT/fp8/step_$name.json" | tr '\n' ' ' | sed "s/^/[$name] /" >>"$OUT/log"; echo >>"$OUT/log"
}
variant bf16 DFLASH_FUSED_SWIGLU=1 --
variant bf16-no-overlap DFLASH_FUSED_SWIGLU=1 -- --overlap-optimizer 0
variant bf16-aten-swiglu DFLASH_FUSED_SWIGLU=0 --
variant fp8 DFLASH_FUSED_SWIGLU=1 -- --precision fp8
pack
OUT="$OUT/oom" GTEST_FILTER='MemoryGpu.TheDrafter*' timeout 200 \
  bash scripts/bench/gpu/gpu_tests.sh run memory_gpu_test
cat "$OUT/oom/log" >>"$OUT/log"; pack
for b in 1 16 64; do
  timeout 60 build/scripts/bench/draft_cache --batch "$b" --prompt 1024 --accept 4 --blocks 64 \
    --warmup 4 --json "$OUT/draft_cache_b$b.json" >>"$OUT/log" 2>&1
done
pack
timeout 150 bash scripts/bench/gpu/sliding_window.sh >/dev/null 2>&1
pack
py=/opt/torch/.venv/bin/python3; [ -x "$py" ] || py=python3
timeout 60 "$py" scripts/bench/fp8_gemm.py --json "$OUT/fp8/gemm.json" >>"$OUT/log" 2>&1
pack

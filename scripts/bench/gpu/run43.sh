#!/usr/bin/env bash
# Device run 43 (2026-12-07), after run 42 (docs/benchmarks.md): its failures fixed and re-run,
# and where the fp8 step's time goes. From binaries built on the CPU machine
# (`scripts/bench/gpu/gpu_tests.sh pack 'drafter_gpu|memory_gpu|swiglu'`; carry .devdeps .gpu/t):
#   1. drafter_gpu_test (the fp8 tests, fixed) and swiglu_gpu_test (the fused SwiGLU, new), the
#      raw GEMMs in PyTorch (scripts/bench/fp8_gemm.py: bf16 against _scaled_mm at the
#      projections' shapes) and the drafter step profiled in bf16 and fp8 (--profile 1), and
#      in bf16 with DFLASH_FUSED_SWIGLU=0 (the composition);
#   2. memory_gpu_test's drafter out-of-memory case (its margin now 1.5 GiB below the full
#      micro-batch's peak);
#   3. the draft cache at batch 1 / 16 / 64 (its drafter's embedding on "cuda" against "cuda:0");
#   4. scripts/bench/gpu/sliding_window.sh (the reference at 8192 only).
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
OUT="$OUT/t" timeout 90 bash scripts/bench/gpu/gpu_tests.sh run 'drafter_gpu|swiglu'
grep -h "^\[fp8\]\|worst relative" "$OUT/t/"*.log >>"$OUT/log"; cat "$OUT/t/log" >>"$OUT/log"
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
py=/opt/torch/.venv/bin/python3; [ -x "$py" ] || py=python3
timeout 60 "$py" scripts/bench/fp8_gemm.py --json "$OUT/fp8/gemm.json" >>"$OUT/log" 2>&1
# bf16 with the fused SwiGLU (default), fp8, then bf16 with the composition (DFLASH_FUSED_SWIGLU=0).
for p in auto fp8 auto-aten; do
  DFLASH_FUSED_SWIGLU=$([ "$p" = auto-aten ] && echo 0 || echo 1) timeout 90 \
    build/scripts/bench/drafter_step --tokens 8192 --anchors 512 --steps 5 --precision "${p%-aten}" \
    --profile 1 --json "$OUT/fp8/profile_$p.json" >"$OUT/fp8/profile_$p.log" 2>&1
  grep -E "ms/step|median|peak" "$OUT/fp8/profile_$p.log" | sed "s/^/[$p] /" | head -n 4 >>"$OUT/log"
done
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

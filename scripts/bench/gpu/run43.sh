#!/usr/bin/env bash
# Device run 43 (2026-12-07), after run 42 (docs/benchmarks.md): its failures fixed and re-run,
# and where the fp8 step's time goes. From binaries built on the CPU machine
# (`scripts/bench/gpu/gpu_tests.sh pack 'drafter_gpu|memory_gpu|dflash_attn'`; carry .devdeps .gpu/t):
#   1. drafter_gpu_test (the fp8 tests, fixed), memory_gpu_test's drafter out-of-memory case (its
#      margin now 1.5 GiB below the full micro-batch's peak);
#   2. the draft cache at batch 1 / 16 / 64 (its drafter's embedding on "cuda" against "cuda:0");
#   3. the raw GEMMs in PyTorch (scripts/bench/fp8_gemm.py: bf16 against _scaled_mm at the
#      projections' shapes) and the drafter step profiled in bf16 and fp8 (--profile 1);
#   4. scripts/bench/gpu/sliding_window.sh (the reference at 8192 only).
# Everything under $OUT, packed into $OUT/run43.tgz at the end (a call returns few files).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT/t" "$OUT/oom" "$OUT/fp8"
OUT="$OUT/t" timeout 60 bash scripts/bench/gpu/gpu_tests.sh run drafter_gpu
grep -h "^\[fp8\]" "$OUT/t/drafter_gpu_test.log" | tee -a "$OUT/log"
OUT="$OUT/oom" GTEST_FILTER='MemoryGpu.TheDrafter*' timeout 200 \
  bash scripts/bench/gpu/gpu_tests.sh run memory_gpu_test
cat "$OUT/t/log" "$OUT/oom/log" >>"$OUT/log"
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
for b in 1 16 64; do
  timeout 60 build/scripts/bench/draft_cache --batch "$b" --prompt 1024 --accept 4 --blocks 64 \
    --warmup 4 --json "$OUT/draft_cache_b$b.json" 2>&1 | tail -4 | tee -a "$OUT/log"
done
py=/opt/torch/.venv/bin/python3; [ -x "$py" ] || py=python3
timeout 60 "$py" scripts/bench/fp8_gemm.py --json "$OUT/fp8/gemm.json" 2>&1 | tee -a "$OUT/log"
for p in auto fp8; do
  timeout 90 build/scripts/bench/drafter_step --tokens 8192 --anchors 512 --steps 5 --precision "$p" \
    --profile 1 --json "$OUT/fp8/profile_$p.json" >"$OUT/fp8/profile_$p.log" 2>&1
  tail -60 "$OUT/fp8/profile_$p.log" | grep -v '^{' >>"$OUT/log"
done
timeout 150 bash scripts/bench/gpu/sliding_window.sh >/dev/null 2>&1
tar -czf "$OUT/run43.tgz" -C "$OUT" --exclude run43.tgz . 2>/dev/null

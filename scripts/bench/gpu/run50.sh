#!/usr/bin/env bash
# Device run 50 (2026-12-07): run47.sh's checks without its timings (the device time left after a
# failed machine start did not cover run 47 whole): nn, spec and drafter GPU tests (generation in
# bf16 against transformers for every family, the hybrids' final norm, the drafter cache's
# buffers), draft_cache's cached hidden states against the whole-context ones at batch 1, 16, 64,
# and the chunked hybrid prefill against the recurrence (gated_delta_extend); since 2026-12-07
# 21:00 UTC also swiglu_gpu_test (the target's fused SwiGLU over its gate_up halves). Pack:
#   scripts/bench/gpu/gpu_tests.sh pack 'nn_gpu|spec_gpu|drafter_gpu|swiglu'
# carry .devdeps .gpu/t; about 2 minutes. Results under $OUT (log, the tests' logs, dc/).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
mkdir -p "$out/dc"
timeout 220 bash scripts/bench/gpu/gpu_tests.sh run 'nn_gpu|spec_gpu|drafter_gpu|swiglu'
grep -h "departs" "$out/nn_gpu_test.log" >>"$out/log" 2>/dev/null
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
for b in 1 16 64; do
  timeout 60 build/scripts/bench/draft_cache --prompt 1024 --accept 4 --blocks 64 --warmup 4 \
    --batch "$b" --json "$out/dc/b$b.json" >"$out/dc/b$b.log" 2>&1
  echo "[run50 draft_cache batch $b] rc $? $(cat "$out/dc/b$b.json" 2>/dev/null || tail -3 "$out/dc/b$b.log")" |
    tee -a "$out/log"
done
for t in 512 2048; do
  echo "[run50 gated_delta_extend $t] $(timeout 60 build/scripts/bench/gated_delta_extend \
    --tokens $t --batch 4 --runs 3 2>&1 | tail -n 1)" | tee -a "$out/log"
done

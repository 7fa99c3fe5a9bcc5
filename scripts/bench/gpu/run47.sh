#!/usr/bin/env bash
# Device run 47 (prepared 2026-12-07, not yet run): the GPU checks of what changed after the
# whole GPU suite ran at 38a5609 (docs/benchmarks.md, "The whole GPU suite at one revision"):
# generation in bf16 against transformers for every family
# (nn_gpu_test's GenerateGpu, and its TensorParallelGpu generation with the hybrids' final norm
# fixed), the drafter cache's buffers (spec_gpu_test, drafter_gpu_test; draft_cache's cached
# hidden states against the whole-context ones at the Qwen3-8B drafter shape, batch 1, 16, 64),
# then eval's tokens/s with and without the cache (run45.sh; since f9f5c8b the decoding drafter
# holds bf16 weights in both settings, so against run 45's figures at 38a5609 the two changes
# show together). Pack:
#   scripts/bench/gpu/gpu_tests.sh pack 'nn_gpu|spec_gpu|drafter_gpu|swiglu' (run50.sh's)
# carry .devdeps .gpu/t; about 5 minutes. Results under $OUT (log, the tests' logs, dc/, sd/).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
# The checks (GPU tests, draft_cache, gated_delta_extend): run50.sh, which holds them.
OUT=$out bash scripts/bench/gpu/run50.sh
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
mkdir -p "$out/sd"
OUT=$out timeout 300 bash scripts/bench/gpu/run45.sh
# Where batch 64's drafter and verification time goes (a profiled decode of 16 tokens).
timeout 150 build/scripts/bench/spec_decode --batch 64 --prompt 512 --new 64 --rounds 1 \
  --profile 1 --profile-new 16 --json "$out/sd/prof64.json" >"$out/sd/prof64.log" 2>&1
echo "[run47 profile batch 64] rc $?" | tee -a "$out/log"
tar -czf "$out/run47.tgz" -C "$out" log dc sd 2>/dev/null

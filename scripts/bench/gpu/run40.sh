#!/usr/bin/env bash
# Device run 40 (prepared 2026-12-06, not yet run): what the session of 2026-12-06 evening left
# unmeasured on a GPU, from binaries built on the CPU machine (scripts/bench/gpu/gpu_tests.sh pack
# there; carry .devdeps .gpu/t; about 9 minutes):
#   1. memory_gpu_test's out-of-memory cases: the drafter's backward (drafter.recompute: layers at
#      32768 / 16384 tokens; it did not finish in 600 s on an H100 at abb7964) and the target's
#      forward; each now fails after 4 minutes with the workers' logs (docs/benchmarks.md, "Real
#      faults and the memory planner");
#   2. the drafter's step in speculative decoding with and without its cache of context keys and
#      values (scripts/bench/draft_cache: the Qwen3-8B drafter shape, 5 layers, block 16, 1,024
#      prompt rows, 4 accepted rows a block, 64 blocks) at batch 1, 16 and 64 (docs/method.md,
#      "Drafting with a cache").
# Run from a checkout on the GPU machine with OUT set; results under $OUT (log, one JSON per batch).
set -uo pipefail
cd "$(dirname "$0")/../../.."
# The benchmarks link LibTorch and the Debian libraries of .devdeps (gpu_tests.sh's run sets these
# for the tests only).
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
export OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT/oom"
OUT="$OUT/oom" GTEST_FILTER='MemoryGpu.TheDrafter*:MemoryGpu.TheTarget*' \
  bash scripts/bench/gpu/gpu_tests.sh run memory_gpu_test
for b in 1 16 64; do
  build/scripts/bench/draft_cache --batch "$b" --prompt 1024 --accept 4 --blocks 64 --warmup 4 \
    --json "$OUT/draft_cache_b$b.json" | tee -a "$OUT/log"
done

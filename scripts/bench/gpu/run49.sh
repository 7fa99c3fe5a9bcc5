#!/usr/bin/env bash
# Device run 49 (prepared 2026-12-07, not yet run): the Qwen3.5-27B-shaped drafter
# (builtin:qwen3.5-27b-random: H 5120, 24/4 heads of 256, I 17408, V 248320; 5 layers) through
# drafter_step: ours and the compiled PyTorch reference at 8192 / 512 (issue 28's "its drafter step
# against the reference in the same run"), then ours alone at 16384 / 1024 and 32768 / 2048, whose
# allocator peaks the memory plan puts at 38.23 and 52.41 GiB (device totals 42.20 and 58.66;
# docs/memory.md; on an 80 GB card the plan's 96-GiB budget of 69,632 tokens cannot be run). Pack: scripts/bench/gpu/gpu_tests.sh pack
# '^$'; carry .devdeps .gpu/t; about 9 minutes. Results under $OUT (log, ds/).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
source scripts/bench/gpu/unpacked.sh run49
target="--target builtin:qwen3.5-27b-random --mask-token 248319"
GEOMS=8192:512 PYTHON=$py OURS_ARGS="$target" timeout 300 \
  bash scripts/bench/drafter_step.sh build "$out/ds" 2>&1 | tail -n 8 | tee -a "$out/log"
for geom in 16384:1024 32768:2048; do
  GEOMS=$geom PHASES=ours PYTHON=$py OURS_ARGS="$target" timeout 120 \
    bash scripts/bench/drafter_step.sh build "$out/ds" 2>&1 | tail -n 2 | cut -c1-600 | tee -a "$out/log"
done
tar -czf "$out/run49.tgz" -C "$out" log ds 2>/dev/null

#!/usr/bin/env bash
# Device run 45 (prepared 2026-12-07): speculative decoding end to end with and without the
# drafter's cache (scripts/bench/spec_decode: builtin:qwen3-8b-random loaded whole, a random
# 5-layer drafter, 512-token prompts, 128 new tokens, 3 alternating rounds) at batch 1, 16 and 64:
# eval's tokens/s before and after the cache. From the pack of `gpu_tests.sh pack` (any filter:
# the benchmarks are always packed); carry .devdeps .gpu/t. Results under $OUT (log, one JSON per
# batch, packed into run45.tgz).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
mkdir -p "$out/sd"
if [ ! -x build/scripts/bench/spec_decode ]; then
  rm -rf build && mkdir -p build && tar -xzf .gpu/t/gt.tgz -C build
fi
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
echo "[run45] built at $(cat .gpu/t/gt.rev), $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee -a "$out/log"
for b in 1 16 64; do
  timeout 150 build/scripts/bench/spec_decode --batch "$b" --prompt 512 --new 128 --rounds 3 \
    --json "$out/sd/b$b.json" >"$out/sd/b$b.log" 2>&1
  echo "[run45 batch $b] rc $? $(cat "$out/sd/b$b.json" 2>/dev/null || tail -3 "$out/sd/b$b.log")" | tee -a "$out/log"
  tar -czf "$out/run45.tgz" -C "$out" sd log 2>/dev/null
done

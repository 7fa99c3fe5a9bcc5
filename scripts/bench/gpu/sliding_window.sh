#!/usr/bin/env bash
# The fused attention of a sliding-window drafter layer by window (docs/benchmarks.md, "Sliding-
# window drafter layers"): forward + backward time of one layer's attention at the Qwen3-8B
# drafter geometry (32/8 heads, head_dim 128, B 16), 16384 context tokens in documents of 4000 to
# 16000 tokens (long enough for a window to matter), 1024 anchors: a full-attention layer, a
# sliding layer without a window, and windows 4096 to 256. Then the same at 8192 / 512 with the
# default documents of 200-2000 tokens, where a window of 2048 hides almost nothing, beside the
# unfused reference (what a sliding layer ran before the kernels took windows).
# From binaries built on the CPU machine (scripts/bench/gpu/gpu_tests.sh pack; carry .devdeps
# .gpu/t), after `gpu_tests.sh run` has unpacked them into build/; results in $OUT/sliding_window.
set -uo pipefail
cd "$(dirname "$0")/../../.."
# The benchmarks link LibTorch and the Debian libraries of .devdeps (gpu_tests.sh's run sets these
# for the tests only).
set +u; source .devdeps/env.sh >/dev/null 2>&1; set -u
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
out=${OUT:?set OUT to the folder the results go to}/sliding_window
mkdir -p "$out"
bench=build/scripts/bench/dflash_attn
echo "[sliding_window] $(cat .gpu/t/gt.rev 2>/dev/null), $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$out/log"
long=(--context 16384 --anchors 1024 --doc-min 4000 --doc-max 16000)
"$bench" "${long[@]}" --json "$out/full.json" | tee -a "$out/log"
for w in 0 4096 2048 1024 512 256; do
  "$bench" "${long[@]}" --window "$w" --json "$out/w$w.json" | tee -a "$out/log"
done
"$bench" --json "$out/short_full.json" | tee -a "$out/log"
# The reference only here: at 16384 / 1024 its [heads, rows, keys] fp32 scores alone are 64 GiB
# (it aborted out of memory on an H100 at acb7f25).
"$bench" --window 2048 --reference 1 --json "$out/short_w2048.json" | tee -a "$out/log"

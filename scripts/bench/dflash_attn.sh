#!/usr/bin/env bash
# Fused DFlash attention against PyTorch FlexAttention (compiled and eager) on the same mask, at the
# Qwen3-8B drafter geometry and at twice that. Run on the GPU machine from a build tree:
#   scripts/bench/dflash_attn.sh BUILD_DIR [OUT_DIR]
set -euo pipefail
build=${1:?usage: dflash_attn.sh BUILD_DIR [OUT_DIR]}
out=${2:-/tmp/dflash_attn_bench}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for geom in "8192 512" "16384 1024"; do
  set -- $geom
  echo "== context $1 tokens, $2 anchors, B=16, 32/8 heads, head_dim 128 =="
  "$build/scripts/bench/dflash_attn" --context "$1" --anchors "$2" --mask-out "$out/mask_$1.txt" \
    --json "$out/ours_$1.json"
  "${PYTHON:-python3}" "$here/dflash_attn_flex.py" --mask "$out/mask_$1.txt" --ours "$out/ours_$1.json" ${DFLASH_FLEX_ARGS:-}
done

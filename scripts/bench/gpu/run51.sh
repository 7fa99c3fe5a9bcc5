#!/usr/bin/env bash
# Device run 51 (prepared 2026-12-07, not yet run): the target forward with its MLP's SwiGLU fused
# over the gate_up halves (common/kernels/swiglu, FusedSwiGluHalves) against the ATen composition,
# one after the other in one call: `target_forward --runs 7` with DFLASH_FUSED_SWIGLU=0, then 1,
# then 0 again (the first pair's order effects show in the third). Qwen3-8B shape, 8192 tokens,
# the four cases (docs/benchmarks.md, "Target model forward"). Run after run50.sh in the same
# lease (its swiglu_gpu_test checks the kernel); the same pack:
#   scripts/bench/gpu/gpu_tests.sh pack 'nn_gpu|spec_gpu|drafter_gpu|swiglu'
# carry .devdeps .gpu/t; about 2 minutes. Results under $OUT (log, tf/).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
mkdir -p "$out/tf"
source scripts/bench/gpu/unpacked.sh run51
for v in 0 1 0; do
  DFLASH_FUSED_SWIGLU=$v timeout 150 build/scripts/bench/target_forward --runs 7 \
    >"$out/tf/swiglu$v.$(date +%s).md" 2>&1
  echo "[run51 DFLASH_FUSED_SWIGLU=$v] rc $?" | tee -a "$out/log"
done
grep -h "dflash packed" "$out"/tf/*.md | tee -a "$out/log"

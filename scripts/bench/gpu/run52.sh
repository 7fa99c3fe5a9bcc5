#!/usr/bin/env bash
# Device run 52 (prepared 2026-12-07 23:30 UTC, reordered 2026-12-08 after refused starts left
# less device time), calls of one warm machine, each in the order of what matters most:
#   1: fused_ce_gpu_test (the fused loss's top-k, DFlash2's candidates since 648b36e),
#      block_conv_gpu_test and drafter_gpu_test (DFlash2's fused block convolution, 0645b18),
#      rope_gpu_test (the target's fused q/k norm and RoPE, 2026-12-08),
#      training_gpu_test's profile case (the workers' profile_steps); D-PACE's step against the
#      compiled reference (issue 29 D5: "the step time of each"; one lm_head pass since 5ce521f);
#      DFlash2's step against the reference again (run 48: 210.3 ms against 199.8 before both
#      changes). About 7 minutes.
#   2: run49.sh (the Qwen3.5-27B-shaped drafter against the reference at 8192 / 512, its peaks at
#      16384 / 1024 and 32768 / 2048 beside the plan's). About 9 minutes.
#   3: pipeline.sh at 8192 / 512 with PROFILE=8:4 (issue 28 D4's table), target_forward
#      --profile 1, without the fused q/k norm and RoPE, without cuDNN for long documents and with
#      both, target_gemms.py (issue 28
#      D3: the forward's device time by kernel), DFlash2's step profiled and with DFLASH_FUSED_BLOCK_CONV=0 (the convolution's share), then
#      memory_gpu_test's ThePlan case with its DFlash2 geometry (the plan was 20% under DFlash2's
#      measured peak before the fused convolution; about 3 minutes).
#   4: nn_gpu_test (the target's bf16 parity with transformers, through the fused q/k norm and
#      RoPE since 2026-12-08; VarlenAttentionGpu's long documents through cuDNN), from its own pack: gpu_tests.sh pack 'nn_gpu' (with the oracles'
#      outputs it does not fit one call beside the others).
# Pack: SERVICES=1 scripts/bench/gpu/gpu_tests.sh pack 'fused_ce|block_conv|drafter_gpu|memory_gpu|training_gpu|rope_gpu'
# (19 MB: with .devdeps and the tree under a call's 64 MiB); carry
# .devdeps .gpu/t.
# Results under $OUT (log, ds2/, dp/, prof/, tf/, pipe/).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
case "${1:?stage 1, 2, 3 or 4}" in
  1)
    # In the order of what matters most, should the call's limit cut it short.
    timeout 120 bash scripts/bench/gpu/gpu_tests.sh run 'fused_ce|block_conv|drafter_gpu|rope_gpu'
    GTEST_FILTER='*Profiles*' timeout 120 bash scripts/bench/gpu/gpu_tests.sh run training_gpu
    source scripts/bench/gpu/unpacked.sh run52
    GEOMS=8192:512 PYTHON=$py OURS_ARGS="--weighting dpace" timeout 150 \
      bash scripts/bench/drafter_step.sh build "$out/dp" 2>&1 | tail -n 8 | tee -a "$out/log"
    GEOMS=8192:512 PYTHON=$py OURS_ARGS="--kind dflash2" timeout 200 \
      bash scripts/bench/drafter_step.sh build "$out/ds2" 2>&1 | tail -n 8 | tee -a "$out/log"
    ;;
  2) bash scripts/bench/gpu/run49.sh ;;
  3)
    source scripts/bench/gpu/unpacked.sh run52-3  # the libraries' path for the benchmarks
    # Issue 28 D4: the one-GPU pipeline with steps 8-11 profiled in both workers (where a step's
    # time goes outside the two processes' kernels).
    PROFILE=8:4 GEOMS=8192:512 PYTHON=$py timeout 150 bash scripts/bench/pipeline.sh build 14 \
      "$out/pipe" 2>&1 | tee -a "$out/log"
    # Issue 28 D3: where the target forward's device time goes (one profiled forward per case).
    mkdir -p "$out/tf" "$out/prof"
    timeout 120 build/scripts/bench/target_forward --runs 5 --profile 1 >"$out/tf/tf.md" \
      2>"$out/tf/profile.txt"
    echo "[run52 target_forward --profile 1] rc $?" | tee -a "$out/log"
    # The fused q/k norm and RoPE's saving and cuDNN's for long documents: the forward without
    # each, then with both again.
    # (and cuDNN from 1024 tokens: whether the mix's documents gain from it too)
    for f in "DFLASH_FUSED_QK_NORM_ROPE=0" "DFLASH_CUDNN_ATTN_MIN_TOKENS=0" "DFLASH_NONE=1" \
      "DFLASH_CUDNN_ATTN_MIN_TOKENS=1024"; do
      env "$f" timeout 90 build/scripts/bench/target_forward --runs 5 >"$out/tf/tf_$f.md" 2>&1
      echo "[run52 target_forward $f] rc $?" | tee -a "$out/log"
    done
    timeout 60 "$py" scripts/bench/target_gemms.py --json "$out/tf/gemms.json" | tee -a "$out/log"
    timeout 60 build/scripts/bench/drafter_step --kind dflash2 --tokens 8192 --anchors 512 \
      --steps 5 --profile 1 --json "$out/prof/dflash2.json" >"$out/prof/dflash2.log" 2>&1
    echo "[run52 profile dflash2] rc $?" | tee -a "$out/log"
    DFLASH_FUSED_BLOCK_CONV=0 timeout 60 build/scripts/bench/drafter_step --kind dflash2 \
      --tokens 8192 --anchors 512 --json "$out/prof/dflash2_conv0.json" \
      >"$out/prof/dflash2_conv0.log" 2>&1
    echo "[run52 dflash2, DFLASH_FUSED_BLOCK_CONV=0] rc $? $(head -c 300 "$out/prof/dflash2_conv0.json")" |
      tee -a "$out/log"
    GTEST_FILTER='MemoryGpu.ThePlan*' timeout 400 bash scripts/bench/gpu/gpu_tests.sh run memory_gpu
    grep -h "memory_gpu_test\] plan" "$out/memory_gpu_test.log" | tee -a "$out/log"
    ;;
  4) timeout 300 bash scripts/bench/gpu/gpu_tests.sh run nn_gpu ;;
  *) echo "usage: run52.sh 1|2|3|4" >&2; exit 2 ;;
esac

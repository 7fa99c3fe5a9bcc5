#!/usr/bin/env bash
# Every gpu-labelled test on the GPU machine without building there: the test binaries and the
# service binaries they start, built on the CPU machine (scripts/build.sh: CUDA 13, sm_90a),
# stripped and packed, then run from the device's copy of the tree.
#   scripts/bench/gpu/gpu_tests.sh pack [FILTER]  (CPU machine) -> .gpu/t/gt.tgz
#   scripts/bench/gpu/gpu_tests.sh run [FILTER]   (GPU machine, carry .devdeps .gpu/t; output in
#                                                  $OUT: log and one JUnit XML per binary)
# FILTER: a grep -E pattern over the binaries' names (default: all). The binaries carry the CPU
# machine's paths (/work/main, its build folder): `run` links /work/main to the device's copy.
# ctest is not used there: its PRE_TEST discovery calls the CPU machine's CMake modules.
set -euo pipefail
root=$(git rev-parse --show-toplevel 2>/dev/null || pwd); cd "$root"
tests=(tests/integration/memory_gpu_test tests/integration/training_gpu_test
       tests/worker/worker_metrics_gpu_test tests/drafter/drafter_gpu_test tests/nn/nn_gpu_test
       tests/spec/spec_gpu_test tests/spec/sampling_gpu_test tests/kernels/dflash_attn_gpu_test tests/kernels/fused_ce_gpu_test
       tests/kernels/fp8_quant_gpu_test tests/kernels/swiglu_gpu_test tests/kernels/block_conv_gpu_test
       tests/kernels/rope_gpu_test tests/kernels/wgmma_gpu_test tests/gpu/device_probe_gpu_test
       tests/transport/feature_checksum_gpu_test tests/transport/nccl_channel_gpu_test
       tests/transport/nccl_communicator_gpu_test)
benches=(scripts/bench/draft_cache scripts/bench/dflash_attn scripts/bench/drafter_step scripts/bench/spec_decode
         scripts/bench/gated_delta_extend scripts/bench/target_forward)  # packed too; run after `run` unpacks
services=(coordinator/dflash-coordinator dflashctl/dflashctl target_worker/dflash-target-worker
          drafter_worker/dflash-drafter-worker target_worker/dflash-target-worker-testhooks
          drafter_worker/dflash-drafter-worker-testhooks)
case "${1:?usage: gpu_tests.sh pack|run [FILTER]}" in
  pack)
    # FILTER (optional, as for run): only the matching test binaries, so that a device call's
    # carry stays under 64 MiB beside .devdeps; the service binaries only for the tests that start
    # them (integration, worker), the transformers oracles' outputs only for nn_gpu_test.
    filter=${2:-.}
    # PACK_BUILT=1: pack what build/ holds (its picked targets built by hand, e.g. with ninja).
    [ "${PACK_BUILT:-0}" = 1 ] || bash scripts/build.sh >/dev/null
    # Every gpu test binary the build made must be on the list above (a new one was left out once).
    for b in $(cd build && find tests -name '*_gpu_test' -type f -perm -u+x | sort); do
      printf '%s\n' "${tests[@]}" | grep -qx "$b" ||
        { echo "gpu_tests.sh: build/$b is not in the list of GPU tests (scripts/bench/gpu/gpu_tests.sh)" >&2; exit 1; }
    done
    rm -rf /tmp/gt && mkdir -p /tmp/gt .gpu/t
    picked=()
    for t in "${tests[@]}"; do echo "$t" | grep -qE "$filter" && picked+=("$t"); done
    files=("${picked[@]}" "${benches[@]}")
    if printf '%s\n' "${picked[@]}" | grep -qE 'integration|worker'; then
      files+=(tests/integration/dflash-test-gpu-hog "${services[@]/#/services/}")
    elif [ "${SERVICES:-0}" = 1 ]; then  # SERVICES=1: the product's binaries (pipeline.sh)
      for b in "${services[@]:0:4}"; do files+=("services/$b"); done
    fi
    for f in "${files[@]}"; do
      mkdir -p "/tmp/gt/$(dirname "$f")"; strip -o "/tmp/gt/$f" "build/$f"
    done
    # The transformers oracles' outputs (made here by the CPU machine's Python, which the GPU
    # machine lacks; their stamp keeps the tests from running it there).
    if printf '%s\n' "${picked[@]}" | grep -q nn_gpu; then
      for d in hf_oracle hf_qwen3_5_oracle; do
        mkdir -p /tmp/gt/tests/nn && cp -r "build/tests/nn/$d" /tmp/gt/tests/nn/
      done
    fi
    # Written aside and renamed: a device call that carries .gpu/t meanwhile gets one whole pack.
    tar -czf .gpu/t/gt.tgz.new -C /tmp/gt . && git rev-parse --short HEAD >.gpu/t/gt.rev.new
    mv .gpu/t/gt.tgz.new .gpu/t/gt.tgz && mv .gpu/t/gt.rev.new .gpu/t/gt.rev
    du -b .gpu/t/gt.tgz ;;
  run)
    filter=${2:-.}
    out=${OUT:-/tmp/gt-out}; mkdir -p "$out"
    if [ "$(realpath /work/main 2>/dev/null)" != "$(realpath .)" ]; then
      mkdir -p /work && rm -rf /work/main && ln -sfn "$(realpath .)" /work/main
    fi
    rm -rf build && mkdir -p build && tar -xzf .gpu/t/gt.tgz -C build
    set +eu; source .devdeps/env.sh >/dev/null 2>&1; set -eu
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
    echo "[gpu_tests] built at $(cat .gpu/t/gt.rev), $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$out/log"
    rc=0
    for t in "${tests[@]}"; do
      echo "$t" | grep -qE "$filter" || continue
      [ -x "build/$t" ] || { echo "[gpu_tests] $(basename "$t"): not in the pack" | tee -a "$out/log"; continue; }
      n=$(basename "$t"); t0=$(date +%s)
      "build/$t" --gtest_output="xml:$out/$n.xml" >"$out/$n.log" 2>&1 || rc=1
      echo "[gpu_tests] $n: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$n.log" | tr '\n' ' ') $(( $(date +%s) - t0 )) s" | tee -a "$out/log"
    done
    grep -h "^\[memory_gpu_test\]\|^\[training_gpu_test\]" "$out"/*.log >>"$out/log" 2>/dev/null || true
    exit "$rc" ;;
esac

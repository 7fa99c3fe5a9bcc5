#!/usr/bin/env bash
# One device run of a benchmark or GPU test on the GPU machine, as the figures in
# docs/benchmarks*.md were taken: unpacks the Debian packages the machine lacks (.devdeps/env.sh,
# made from scripts/gpu-debs.txt), configures and builds the named targets into BUILD, then runs
# the command with BUILD exported, teeing its output to $OUT/log (or OUT_DIR) so that the figures
# come back even when the command is stopped.
#
#   scripts/bench/device_run.sh BUILD "TARGET ..." COMMAND...
#   e.g. scripts/bench/device_run.sh /tmp/b "drafter_step" scripts/bench/drafter_step.sh /tmp/b $OUT
#        scripts/bench/device_run.sh /tmp/b "nn_gpu_test" ctest --test-dir /tmp/b -L gpu
#
# The documents' older figures name "device run NN": a call of this form whose own wrapper file
# was not kept; the command beside each figure is what it ran. scripts/bench/gpu/runNN.sh now holds
# each one, reconstructed from that recorded command (scripts/bench/gpu/README.md lists them).
set -euo pipefail
build=${1:?usage: device_run.sh BUILD "TARGET ..." COMMAND...}
targets=${2:?usage: device_run.sh BUILD "TARGET ..." COMMAND...}
shift 2
log=${OUT:-${OUT_DIR:-/tmp}}/log
[ -f .devdeps/env.sh ] && source .devdeps/env.sh >/dev/null
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
cmake -S . -B "$build" -G Ninja ${DFLASH_GPU_CMAKE_ARGS:-} \
  -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} >"$build.configure.log" 2>&1 ||
  { tail -n 30 "$build.configure.log"; exit 1; }
# shellcheck disable=SC2086  # one word per target
cmake --build "$build" -j "$(nproc)" --target $targets 2>&1 | tail -n 3
echo "[device_run] $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ): $*" | tee "$log"
export BUILD=$build
"$@" 2>&1 | tee -a "$log"

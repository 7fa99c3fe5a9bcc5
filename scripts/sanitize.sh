#!/usr/bin/env bash
# Builds dflash once more with AddressSanitizer + UndefinedBehaviorSanitizer (GCC's, -O1, line
# tables only) and runs the unit tests under them; any sanitizer report fails the test that made
# it. CI runs this after scripts/test.sh (.ci/run).
#
# Covered: every library and unit test that does not use LibTorch (configuration, run.yaml,
# tokenizer, data, batching, coordinator logic, run store, transports, metrics, memory planner,
# kernels' schedules): the build is configured with DFLASH_WITH_TORCH=OFF and DFLASH_WITH_CUDA=OFF,
# because LibTorch's own code is not instrumented and its translation units would double CI time.
# The parsers of untrusted input are also fuzzed under both sanitizers (scripts/fuzz.sh).
#
# Build directory: $DFLASH_SANITIZE_BUILD_DIR (default build-asan/ in the source tree).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=${DFLASH_SANITIZE_BUILD_DIR:-$root/build-asan}
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDFLASH_WITH_TORCH=OFF \
  -DDFLASH_WITH_CUDA=OFF -DCMAKE_CXX_FLAGS="$san" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j "${DFLASH_JOBS:-$(nproc)}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" -L unit --output-on-failure -j "${DFLASH_TEST_JOBS:-2}" --timeout 600
echo "[sanitize] unit tests passed under AddressSanitizer + UndefinedBehaviorSanitizer" >&2

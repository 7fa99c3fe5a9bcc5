#!/usr/bin/env bash
# Fuzzes the safetensors header parser (tests/checkpoint/safetensors_header_fuzz.cc) with
# libFuzzer + AddressSanitizer + UBSan for SECONDS (default 30), starting from a copy of the
# checked-in seed corpus. Exits non-zero on any crash or sanitizer report; the input that caused
# it is left in build-fuzz/artifacts/. Add such an input to tests/checkpoint/fuzz_corpus/ once the
# parser is fixed, so that the ordinary build replays it (ctest -R safetensors_header_fuzz_replay).
#
# Needs clang-14 and libclang-rt-14-dev (libFuzzer and sanitizer runtimes), plus the abseil and
# nlohmann-json development packages the normal build uses.
#   usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
out=${DFLASH_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++-14}

command -v "$cxx" >/dev/null || { echo "[fuzz] $cxx not found (apt-get install clang-14)" >&2; exit 2; }
rt="$("$cxx" -print-resource-dir)/lib/linux/libclang_rt.fuzzer-$(uname -m).a"
[ -f "$rt" ] || { echo "[fuzz] no libFuzzer runtime at $rt (apt-get install libclang-rt-14-dev)" >&2; exit 2; }
rm -rf "$out/artifacts"  # a crash input from an earlier run must not fail this one
mkdir -p "$out/artifacts"

# Only what the target needs: the parser and its abseil dependencies. abseil and libstdc++ stay
# uninstrumented, which ASan tolerates.
# shellcheck disable=SC2054  # the commas belong to -fsanitize=
flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I"$root")
libs=$(pkg-config --libs absl_status absl_statusor absl_strings)
echo "[fuzz] building $out/safetensors_header_fuzz" >&2
# shellcheck disable=SC2086  # $libs is a list of flags
"$cxx" "${flags[@]}" -o "$out/safetensors_header_fuzz" \
  "$root/common/model/safetensors.cc" "$root/tests/checkpoint/safetensors_header_fuzz.cc" $libs

corpus=$(mktemp -d "${TMPDIR:-/tmp}/dflash_fuzz_corpus.XXXXXX")
trap 'rm -rf "$corpus"' EXIT
cp "$root"/tests/checkpoint/fuzz_corpus/* "$corpus/"

echo "[fuzz] running for ${seconds}s" >&2
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
set +e
"$out/safetensors_header_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 -dict="$root/tests/checkpoint/safetensors_header.dict" \
  -artifact_prefix="$out/artifacts/" "$corpus" 2>&1 | tee "$out/fuzz.log"
rc=${PIPESTATUS[0]}
set -e
found=$(find "$out/artifacts" -type f | wc -l)
if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
  echo "[fuzz] FAILED (exit $rc, $found artifact(s) in $out/artifacts)" >&2
  exit 1
fi
echo "[fuzz] no crashes in ${seconds}s" >&2

#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input with libFuzzer + AddressSanitizer + UBSan, SECONDS in total
# (default 60) shared equally by the targets, each starting from a copy of its checked-in seed
# corpus:
#   safetensors_header  tests/checkpoint/safetensors_header_fuzz.cc  (checkpoint headers)
#   record              tests/data/record_fuzz.cc                    (JSONL training records)
#   prepared            tests/data/prepared_fuzz.cc                  (prepared data set files)
#   tokenizer           tests/tokenizer/tokenizer_fuzz.cc            (text to encode, tokenizer.json)
# Exits non-zero on any crash or sanitizer report; the input that caused it is left in
# build-fuzz/artifacts/<target>/. Add such an input to the target's corpus once the parser is
# fixed, so that the ordinary build replays it (ctest -R fuzz_replay). The gen_* seeds of the
# prepared corpus come from tests/data/prepared_fuzz_seeds.cc (--write DIR; ctest checks them).
#
# Needs clang-14 and libclang-rt-14-dev (libFuzzer and sanitizer runtimes), plus the development
# packages the normal build uses (abseil, nlohmann-json, PCRE2, utf8proc, OpenSSL, zlib).
#   usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
all_targets=(safetensors_header record prepared tokenizer)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
out=${DFLASH_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${CXX_FUZZ:-clang++-14}

command -v "$cxx" >/dev/null || { echo "[fuzz] $cxx not found (apt-get install clang-14)" >&2; exit 2; }
rt="$("$cxx" -print-resource-dir)/lib/linux/libclang_rt.fuzzer-$(uname -m).a"
[ -f "$rt" ] || { echo "[fuzz] no libFuzzer runtime at $rt (apt-get install libclang-rt-14-dev)" >&2; exit 2; }
rm -rf "$out/artifacts"  # a crash input from an earlier run must not fail this one
mkdir -p "$out"

# Only what each target needs: the parser and its dependencies. abseil, libstdc++ and the system
# libraries stay uninstrumented, which ASan tolerates.
# shellcheck disable=SC2054  # the commas belong to -fsanitize=
flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I"$root")
absl=$(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format absl_hash \
       absl_raw_hash_set)

# Sets src (sources), libs, corpus, dict and max_len for target $1.
describe() {
  dict=""
  max_len=65536
  case "$1" in
    safetensors_header)
      src=("$root/common/model/safetensors.cc" "$root/common/base/file_mode.cc"
           "$root/tests/checkpoint/safetensors_header_fuzz.cc")
      libs=$absl
      corpus="$root/tests/checkpoint/fuzz_corpus"
      dict="$root/tests/checkpoint/safetensors_header.dict" ;;
    record)
      src=("$root/common/data/records.cc" "$root/tests/data/record_fuzz.cc")
      libs=$absl
      corpus="$root/tests/data/fuzz_corpus_records"
      dict="$root/tests/data/record_fuzz.dict" ;;
    prepared)
      src=("$root/common/data/prepared.cc" "$root/tests/data/prepared_fuzz.cc")
      libs="$absl -lz"
      corpus="$root/tests/data/fuzz_corpus_prepared"
      max_len=32768 ;;
    tokenizer)
      src=("$root"/common/tokenizer/*.cc "$root/common/base/logging.cc"
           "$root/tests/tokenizer/tokenizer_fuzz.cc")
      libs="$absl $(pkg-config --libs libpcre2-8 libutf8proc libcrypto)"
      corpus="$root/tests/tokenizer/fuzz_corpus"
      max_len=8192 ;;
    *) echo "[fuzz] unknown target $1 (known: ${all_targets[*]})" >&2; exit 2 ;;
  esac
}

share=$(( seconds / ${#targets[@]} ))
[ "$share" -ge 1 ] || share=1
failed=0
for t in "${targets[@]}"; do
  describe "$t"
  echo "[fuzz] building $out/${t}_fuzz" >&2
  # shellcheck disable=SC2086  # $libs is a list of flags
  "$cxx" "${flags[@]}" -o "$out/${t}_fuzz" "${src[@]}" $libs
  work=$(mktemp -d "${TMPDIR:-/tmp}/dflash_fuzz_${t}.XXXXXX")
  cp "$corpus"/* "$work/"
  mkdir -p "$out/artifacts/$t"
  echo "[fuzz] $t: running for ${share}s" >&2
  set +e
  ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$out/${t}_fuzz" -max_total_time="$share" -timeout=10 -rss_limit_mb=2048 \
    -max_len="$max_len" -print_final_stats=1 ${dict:+-dict="$dict"} \
    -artifact_prefix="$out/artifacts/$t/" "$work" >"$out/$t.log" 2>&1
  rc=$?
  set -e
  rm -rf "$work"
  grep -E "^stat::" "$out/$t.log" | sed "s/^/[fuzz] $t: /" >&2  # libFuzzer's final stats
  found=$(find "$out/artifacts/$t" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    echo "[fuzz] $t FAILED (exit $rc, $found artifact(s) in $out/artifacts/$t); log:" >&2
    tail -n 40 "$out/$t.log" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1
echo "[fuzz] no crashes in ${seconds}s over: ${targets[*]}" >&2

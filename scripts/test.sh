#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, integration, and gpu-labelled tests, which skip
# without a GPU), then fuzzes the parsers for a bounded time. This is the README's second command
# and what CI runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
build=${DFLASH_BUILD_DIR:-$root/build}
ctest --test-dir "$build" --output-on-failure -j "${DFLASH_TEST_JOBS:-2}" --timeout 300
# Bounded fuzzing of the untrusted-input parsers (longer runs: scripts/fuzz.sh SECONDS).
"$root/scripts/fuzz.sh" "${DFLASH_FUZZ_SECONDS:-60}"

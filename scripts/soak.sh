#!/usr/bin/env bash
# The fault-tolerance soak test for longer than CI runs it: ROUNDS runs (default 10) of
# tests/integration/soak_test.cc, each with its own kill schedule (DFLASH_SOAK_SEED = 1..ROUNDS)
# and STEPS steps (default 300): per round, a random worker SIGKILLed three times and the
# coordinator once, the loss curve compared bit for bit with an undisturbed run. Prints one line
# per round and exits non-zero at the first failure (its logs are kept; the path is printed).
# Needs a build (scripts/build.sh); DFLASH_BUILD_DIR as there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLASH_BUILD_DIR:-$root/build}
rounds=${1:-10}
steps=${2:-300}
bin="$build/tests/integration/soak_test"
[ -x "$bin" ] || { echo "soak.sh: $bin not built (run scripts/build.sh)" >&2; exit 2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for seed in $(seq 1 "$rounds"); do
  start=$(date +%s)
  if DFLASH_SOAK_SEED=$seed DFLASH_SOAK_STEPS=$steps "$bin" >"$log" 2>&1; then
    summary=$(grep '^\[soak\] [0-9]* steps' "$log" | sed 's/^\[soak\] //')
    printf 'round %3d  seed %3d  %4d s  ok    %s\n' "$seed" "$seed" "$(($(date +%s) - start))" "$summary"
  else
    printf 'round %3d  seed %3d  FAILED\n' "$seed" "$seed"
    cat "$log"
    exit 1
  fi
done
echo "soak: $rounds rounds of $steps steps passed"

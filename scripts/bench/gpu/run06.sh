#!/usr/bin/env bash
# Device run 6. The recorded name was used for two calls on 2026-12-03:
#   scripts/bench/gpu/run06.sh        (main at 02dbbf5) the drafter step, ours at 8192 / 512 and
#       16384 / 1024 tokens / anchors, then the target forward alone at 8192 and 16384 tokens, then
#       the PyTorch reference at both geometries.
#       Cited in: docs/benchmarks-training.md, "Re-measured with the fused optimizer, one lease
#       (2026-12-03, main at 02dbbf5)".
#   scripts/bench/gpu/run06.sh 16384  (main at da969f4) the drafter step at 16384 / 1024, ours then
#       the reference.
#       Cited in: docs/benchmarks-training.md, "16384 tokens / 1024 anchors (2026-12-03, main at
#       da969f4, a later lease)".
# Both: one NVIDIA H200, Release build.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: PYTHON=/opt/torch/.venv/bin/python3 (the reference's interpreter, from the command
# recorded in "Drafter training step against a PyTorch reference on one H200"); for the da969f4
# call, whose command elides the build and output folders ("..."), /tmp/b and $OUT/ds.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
case ${1:-} in
  '') exec scripts/bench/device_run.sh /tmp/b "drafter_step target_forward" \
        bash scripts/bench/gpu/run06.sh steps ;;
  16384) exec scripts/bench/device_run.sh /tmp/b drafter_step \
        bash scripts/bench/gpu/run06.sh steps16384 ;;
  steps|steps16384) ;;
  *) echo "usage: scripts/bench/gpu/run06.sh [16384]" >&2; exit 2 ;;
esac
# Inside device_run.sh (BUILD exported):
if [ "$1" = steps16384 ]; then
  GEOMS=16384:1024 PHASES=ours scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds"
  GEOMS=16384:1024 PHASES=ref scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds"
  exit 0
fi
PHASES=ours scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds"
"$BUILD/scripts/bench/target_forward" --runs 5 --tokens 8192
"$BUILD/scripts/bench/target_forward" --runs 5 --tokens 16384
PHASES=ref scripts/bench/drafter_step.sh "$BUILD" "$OUT/ds"

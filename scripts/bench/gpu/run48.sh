#!/usr/bin/env bash
# Device run 48 (prepared 2026-12-07, not yet run): the DFlash2 drafter's training step against
# the PyTorch reference of the same step (issue 29's "step time of each against the PyTorch
# reference"), and DFlash's in the same call: drafter_step.sh at 8192 / 512 for --kind dflash2
# and dflash (ours, then the compiled reference from the same batch and weights; the first-step
# losses cross-checked). Pack: scripts/bench/gpu/gpu_tests.sh pack '^$' (the benchmarks only);
# carry .devdeps .gpu/t; about 8 minutes. Results under $OUT (log, ds2/, ds/).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
source scripts/bench/gpu/unpacked.sh run48
GEOMS=8192:512 PYTHON=$py OURS_ARGS="--kind dflash2" timeout 290 \
  bash scripts/bench/drafter_step.sh build "$out/ds2" 2>&1 | tail -n 8 | tee -a "$out/log"
GEOMS=8192:512 PYTHON=$py timeout 250 \
  bash scripts/bench/drafter_step.sh build "$out/ds" 2>&1 | tail -n 8 | tee -a "$out/log"
tar -czf "$out/run48.tgz" -C "$out" log ds2 ds 2>/dev/null

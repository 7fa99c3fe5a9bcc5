#!/usr/bin/env bash
# Device run 16: Nsight Compute on the delta-rule kernels (speed of light, occupancy) of the
# Qwen3.5-27B-shaped scan at 8192 tokens: `ncu --kernel-name regex:GatedDelta --section
# SpeedOfLight --section Occupancy target_forward --model qwen3.5-27b --scan_only 1`.
# Cited in: docs/benchmarks.md, "Qwen3.5-27B-shaped hybrid target forward on one H200 (the hybrid
# shape)" (the ncu figures, "device run 16's build").
# Recorded: 2026-12-04, at e68590f, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: that the ncu command ran in device run 16 on that call's build of target_forward (the
# docs say "device run 16's build"). `--scan_only` first appears in c6ee2fc (committed after
# e68590f), so the call did not run e68590f exactly as committed; what tree it ran is not
# recorded. ncu (NVIDIA Nsight Compute) must be on the machine: the repository does not install
# it. Build type not recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b target_forward \
  ncu --kernel-name regex:GatedDelta --section SpeedOfLight --section Occupancy \
  /tmp/b/scripts/bench/target_forward --model qwen3.5-27b --scan_only 1

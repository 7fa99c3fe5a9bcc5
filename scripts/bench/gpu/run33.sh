#!/usr/bin/env bash
# Device run 33: the feature transport alone (transport_bench): cuda_ipc at 8192 and 16384 tokens
# (50 batches), host at 8192 tokens (12 batches), and cuda_ipc with one bit flipped in batch 9 of
# 20 (--corrupt-batch 9: the bit check must catch it, exit status 2).
# Cited in: docs/benchmarks-training.md, "The feature transport alone (2026-12-04, main at
# fd9a0ac)" (the table and the --corrupt-batch line).
# Recorded: 2026-12-04, main at fd9a0ac, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# NOT the original code: at fd9a0ac transport_bench had no device feature checksum; since 357bbd5
# it always takes and checks one on cuda_ipc, and nothing turns it off. The closest equivalent is
# this same command on the current tree, which measures what device run 34 measured (the receive
# and release as at fd9a0ac, plus the checksum's time).
# Inferred: the docs give the program, the transports, sizes and batch counts, not the command
# line; --step-ms 145.4 / 275.6 (the drafter steps the share is taken of) and the corrupted run's
# transport (cuda_ipc, the default). Build type not recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b transport_bench \
  bash scripts/bench/gpu/run33.sh steps
# Inside device_run.sh (BUILD exported):
tb=$BUILD/scripts/bench/transport_bench
"$tb" --transport cuda_ipc --tokens 8192 --step-ms 145.4
"$tb" --transport cuda_ipc --tokens 16384 --step-ms 275.6
"$tb" --transport host --tokens 8192 --batches 12 --step-ms 145.4
"$tb" --transport cuda_ipc --tokens 8192 --batches 20 --corrupt-batch 9 || [ $? -eq 2 ]

#!/usr/bin/env bash
# Device run 34: the feature transport with the device feature checksum (transport_bench, cuda_ipc
# at 8192 and 16384 tokens, 50 batches; one bit flipped in batch 9 of 20, exit status 2), then the
# GPU tests of the checksum: feature_checksum_gpu_test and the two TrainingCluster.GpuPair* tests
# (the pair through cuda_ipc; a flipped bit after the target's checksum refused by the drafter).
# Cited in: docs/benchmarks-training.md, "The feature transport alone (2026-12-04, main at
# fd9a0ac)" (the item "With the device feature checksum").
# Recorded: 2026-12-04, at 357bbd5, one NVIDIA H200 (another lease than device run 33).
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the command lines (the docs give sizes and batch counts): --step-ms 145.4 / 275.6 (the
# drafter steps the share is taken of), the corrupted run's transport (cuda_ipc, the default), the
# test binaries run directly. Build type not recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b \
  "transport_bench feature_checksum_gpu_test training_gpu_test" \
  bash scripts/bench/gpu/run34.sh steps
# Inside device_run.sh (BUILD exported):
tb=$BUILD/scripts/bench/transport_bench
"$tb" --transport cuda_ipc --tokens 8192 --step-ms 145.4
"$tb" --transport cuda_ipc --tokens 16384 --step-ms 275.6
"$tb" --transport cuda_ipc --tokens 8192 --batches 20 --corrupt-batch 9 || [ $? -eq 2 ]
"$BUILD/tests/transport/feature_checksum_gpu_test"
"$BUILD/tests/integration/training_gpu_test" --gtest_filter='TrainingCluster.GpuPair*'

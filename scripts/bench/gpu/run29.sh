#!/usr/bin/env bash
# Device run 29: the GPU tests of the lean drafter ops: DrafterGpu (fp32 and bf16 against the CPU
# drafter), SpeculativeGpuTest (the drafter's embeddings from host memory) and
# TrainingCluster.GpuPairTrainsThroughCudaIpcWithTheLossCurveOfHost.
# Cited in: docs/benchmarks-training.md, "The pipeline with the lean ops (one H200, main at
# e1a13af / cfbd788)" (the paragraph "GPU tests of the changed code").
# Recorded: 2026-12-04, main at cfbd788, one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the docs name the tests, not the command; they run here through ctest -R on their
# names from the three test binaries. Build type not recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
exec scripts/bench/device_run.sh /tmp/b "drafter_gpu_test spec_gpu_test training_gpu_test" \
  ctest --test-dir /tmp/b -R 'DrafterGpu|SpeculativeGpuTest|'\
'TrainingCluster.GpuPairTrainsThroughCudaIpcWithTheLossCurveOfHost'

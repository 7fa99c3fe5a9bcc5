// Generation in bf16 on a GPU against transformers' fp32 greedy generation, for every family's
// tiny checkpoint (bf16_generation.h: the fp32 token wherever the fp32 margin is not a near-tie,
// no more departures than transformers' own bf16 plus a few, free-running equal up to the first
// near-tie). The CPU's run of the same check is generate_test.cc's. Labelled gpu; skipped without
// a CUDA device.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/nn/bf16_generation.h"
#include "tests/nn/oracle.h"

namespace dflash::nn {
namespace {

TEST(GenerateGpu, Bf16PicksTheFp32TokensExceptAtNearTies) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const std::string error = oracle::GenerateOracleOutputs();
  ASSERT_TRUE(error.empty()) << error;
  const std::string qwen35_error = oracle::GenerateQwen35OracleOutputs();
  ASSERT_TRUE(qwen35_error.empty()) << qwen35_error;
  for (const auto& [family, dir] : oracle::AllFamilies()) {
    SCOPED_TRACE(family);
    oracle::CheckBf16AgainstFp32(family, dir, c10::Device(c10::kCUDA, 0));
  }
}

}  // namespace
}  // namespace dflash::nn

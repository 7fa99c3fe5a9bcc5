// Generation and speculative decoding on a CUDA device (fp32, the built-in tiny target): greedy
// output equal to the CPU's, the batched cached attention equal to one sequence at a time, and
// speculative decoding equal to greedy decoding. Skipped without a device.
#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/drafter/drafter_model.h"
#include "common/nn/builtin_target.h"
#include "common/nn/generate.h"
#include "common/spec/speculative.h"

namespace dflash::spec {
namespace {

const std::vector<std::vector<int64_t>> kPrompts = {
    {20, 31, 99, 400, 17}, {300}, {45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56}, {16, 17}};

std::unique_ptr<nn::TargetModel> Target(c10::Device device) {
  nn::TargetModelOptions options;
  options.dtype = at::kFloat;
  options.full = true;
  options.device = device;
  auto target = nn::BuiltinTarget("tiny-qwen3", options);
  EXPECT_TRUE(target.ok()) << target.status();
  return target.ok() ? std::move(*target) : nullptr;
}

std::vector<std::vector<int64_t>> Greedy(const nn::TargetModel& t,
                                         const std::vector<std::vector<int64_t>>& prompts) {
  nn::GenerateOptions o;
  o.max_new_tokens = 40;
  auto out = nn::Generate(t, prompts, o);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<std::vector<int64_t>> tokens;
  for (const auto& g : *out) tokens.push_back(g.tokens);
  return tokens;
}

TEST(SpeculativeGpuTest, GreedyAndSpeculativeDecodingMatchTheCpu) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto cpu = Target(c10::Device(c10::DeviceType::CPU));
  auto gpu = Target(c10::Device(c10::DeviceType::CUDA, 0));
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const auto want = Greedy(*cpu, kPrompts);
  EXPECT_EQ(Greedy(*gpu, kPrompts), want);  // batched cached attention on the device
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(Greedy(*gpu, {kPrompts[i]})[0], want[i]) << "prompt " << i << " alone";
  }
  drafter::DrafterConfig config;
  config.target = gpu->config();
  config.num_layers = 1;
  config.block_size = 8;
  config.mask_token_id = 1;
  config.target_layer_ids = gpu->layer_ids();
  drafter::DrafterOptions options;
  options.device = c10::Device(c10::DeviceType::CUDA, 0);
  auto d = drafter::DrafterModel::Create(config, options, gpu->embed_tokens(), gpu->lm_head());
  ASSERT_TRUE(d.ok()) << d.status();
  SpecDecodeOptions so;
  so.max_new_tokens = 40;
  auto out = SpeculativeGenerate(*gpu, **d, kPrompts, so);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->tokens, want);
  EXPECT_GT(out->stats.verifications, 0);
}

}  // namespace
}  // namespace dflash::spec

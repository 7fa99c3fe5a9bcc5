#include "tests/nn/bf16_generation.h"

#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "common/nn/generate.h"
#include "common/nn/target_model.h"
#include "tests/nn/oracle.h"

namespace dflash::nn::oracle {

std::vector<std::pair<std::string, std::filesystem::path>> AllFamilies() {
  return {{"qwen3", OracleDir()},         {"llama", OracleDir()},
          {"qwen3_moe", OracleDir()},     {"qwen3_next", OracleDir()},
          {"qwen3_5", Qwen35OracleDir()}, {"qwen3_5_moe", Qwen35OracleDir()}};
}

void CheckBf16AgainstFp32(const std::string& family, const std::filesystem::path& dir,
                          c10::Device device) {
  TargetModelOptions options;
  options.dtype = at::kBFloat16;
  options.device = device;
  options.full = true;
  auto model = TargetModel::Load((dir / family).string(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  auto t = ReadAll(dir / (family + "_generate.safetensors"));
  ASSERT_TRUE(t.count("margins") && t.count("bf16_argmax")) << "an oracle file without margins";
  const std::vector<int64_t> all = ToVector(t["prompts"]);
  const std::vector<int64_t> lengths = ToVector(t["prompt_lengths"]);
  size_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "prompt " << i);
    const std::vector<int64_t> prompt(all.begin() + at, all.begin() + at + lengths[i]);
    at += lengths[i];
    const std::vector<int64_t> tokens = ToVector(t["outputs"][i]);
    const std::vector<int64_t> theirs = ToVector(t["bf16_argmax"][i]);
    const at::Tensor margins = t["margins"][i].to(at::kDouble);
    const int64_t n = static_cast<int64_t>(tokens.size());
    // Teacher-forced: one extension over prompt + the fp32 tokens, the logits of every step.
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), tokens.begin(), tokens.end());
    auto cache = KvCache::Create(**model, 1, static_cast<int64_t>(seq.size()));
    ASSERT_TRUE(cache.ok()) << cache.status();
    auto out = (*model)->Extend({0}, {seq}, cache->get(), false);
    ASSERT_TRUE(out.ok()) << out.status();
    const int64_t first = static_cast<int64_t>(prompt.size()) - 1;
    auto logits = (*model)->Logits(out->hidden.narrow(0, first, n));
    ASSERT_TRUE(logits.ok()) << logits.status();
    const std::vector<int64_t> ours = ToVector(logits->argmax(-1).to(at::kCPU));
    int ours_off = 0, theirs_off = 0;
    for (int64_t s = 0; s < n; ++s) {
      theirs_off += theirs[s] != tokens[s];
      if (ours[s] == tokens[s]) continue;
      ++ours_off;
      const double margin = margins[s].item<double>();
      EXPECT_LT(margin, kTieMargin)
          << "step " << s << ": bf16 picked " << ours[s] << " over the fp32 token " << tokens[s]
          << " at a margin of " << margin;
    }
    std::printf(
        "%s prompt %zu: bf16 departs from the fp32 tokens at %d of %ld steps (transformers' "
        "bf16: %d)\n",
        family.c_str(), i, ours_off, n, theirs_off);
    EXPECT_LE(ours_off, theirs_off + 2);
    // Free-running: the fp32 tokens up to the first near-tie.
    int64_t sure = 0;
    while (sure < n && margins[sure].item<double>() >= kTieMargin) ++sure;
    GenerateOptions greedy;
    greedy.max_new_tokens = n;
    auto generated = Generate(**model, {prompt}, greedy);
    ASSERT_TRUE(generated.ok()) << generated.status();
    const std::vector<int64_t>& got = (*generated)[0].tokens;
    ASSERT_EQ(static_cast<int64_t>(got.size()), n);
    for (int64_t s = 0; s < sure; ++s) {
      EXPECT_EQ(got[s], tokens[s]) << "free-running step " << s << " (before any near-tie)";
    }
  }
}

}  // namespace dflash::nn::oracle

// Generation with the KV cache (common/nn/generate.h) on CPU, fp32: greedy output equal to Hugging
// Face transformers' generate on the oracles' tiny checkpoints of every family (Qwen3, Llama,
// Qwen3-MoE and the hybrids Qwen3-Next, Qwen3.5, Qwen3.5-MoE), the cache against a
// full recompute, batching, stop tokens, sampling and the errors.
#include "common/nn/generate.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/nn/target_model.h"
#include "tests/nn/bf16_generation.h"
#include "tests/nn/oracle.h"

namespace dflash::nn {
namespace {

namespace fs = std::filesystem;
using oracle::ReadAll;
using oracle::ToVector;

class GenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { *oracle_error_ = oracle::GenerateOracleOutputs(); }
  void SetUp() override { ASSERT_TRUE(oracle_error_->empty()) << *oracle_error_; }

  static std::unique_ptr<TargetModel> LoadFull(const std::string& family,
                                               const fs::path& dir = oracle::OracleDir()) {
    TargetModelOptions options;
    options.dtype = at::kFloat;
    options.full = true;
    auto model = TargetModel::Load((dir / family).string(), options);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  struct Refs {
    std::vector<std::vector<int64_t>> prompts, outputs;
  };
  static Refs ReadRefs(const std::string& family, const fs::path& dir = oracle::OracleDir()) {
    auto t = ReadAll(dir / (family + "_generate.safetensors"));
    Refs r;
    const std::vector<int64_t> all = ToVector(t["prompts"]);
    size_t at = 0;
    for (int64_t n : ToVector(t["prompt_lengths"])) {
      r.prompts.emplace_back(all.begin() + at, all.begin() + at + n);
      at += n;
    }
    for (int64_t i = 0; i < t["outputs"].size(0); ++i) {
      r.outputs.push_back(ToVector(t["outputs"][i]));
    }
    return r;
  }

  static std::string* oracle_error_;
};

std::string* GenerateTest::oracle_error_ = new std::string;

GenerateOptions Greedy(int64_t max_new_tokens) {
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  return o;
}

// The hybrids (Qwen3-Next from hf_oracle.py, Qwen3.5 dense and MoE from hf_qwen3_5_oracle.py) keep
// each linear-attention layer's convolution rows and recurrent state per sequence beside the
// attention layers' KV cache; transformers' generate() keeps them in its own cache.
TEST_F(GenerateTest, GreedyMatchesTransformersBatchedAndAlone) {
  const std::string qwen35_error = oracle::GenerateQwen35OracleOutputs();
  ASSERT_TRUE(qwen35_error.empty()) << qwen35_error;
  for (const auto& [family, dir] : oracle::AllFamilies()) {
    auto model = LoadFull(family, dir);
    ASSERT_NE(model, nullptr);
    const Refs refs = ReadRefs(family, dir);
    const int64_t n = static_cast<int64_t>(refs.outputs[0].size());
    auto batched = Generate(*model, refs.prompts, Greedy(n));
    ASSERT_TRUE(batched.ok()) << batched.status();
    ASSERT_EQ(batched->size(), refs.prompts.size());
    for (size_t i = 0; i < refs.prompts.size(); ++i) {
      EXPECT_EQ((*batched)[i].tokens, refs.outputs[i]) << family << " prompt " << i;
      EXPECT_FALSE((*batched)[i].stopped);
      auto alone = Generate(*model, {refs.prompts[i]}, Greedy(n));
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_EQ((*alone)[0].tokens, refs.outputs[i]) << family << " prompt " << i << " alone";
    }
  }
}

// bf16 (docs/models.md, "Generation in bf16"): transformers' own bf16 copy of these tiny random
// checkpoints picks another token than their fp32 greedy generation at several steps (at fp32
// logit margins up to about 0.45), so bf16 cannot equal fp32 token for token; what must hold
// instead is bf16_generation.h's check. On the CPU here; on a GPU in generate_gpu_test.cc.
TEST_F(GenerateTest, Bf16PicksTheFp32TokensExceptAtNearTies) {
  const std::string qwen35_error = oracle::GenerateQwen35OracleOutputs();
  ASSERT_TRUE(qwen35_error.empty()) << qwen35_error;
  for (const auto& [family, dir] : oracle::AllFamilies()) {
    SCOPED_TRACE(family);
    oracle::CheckBf16AgainstFp32(family, dir, c10::Device(c10::kCPU));
  }
}

// transformers' repetition_penalty (1.3) in greedy generation: the oracle's prompts end with a
// repeat of their first token, so that the penalty changes the logits from the first step.
TEST_F(GenerateTest, GreedyWithARepetitionPenaltyMatchesTransformers) {
  auto model = LoadFull("qwen3");
  ASSERT_NE(model, nullptr);
  const Refs refs = ReadRefs("qwen3_penalty");
  const std::vector<std::vector<int64_t>>& prompts = refs.prompts;
  const std::vector<std::vector<int64_t>>& want = refs.outputs;
  const double penalty =
      ReadAll(oracle::OracleDir() / "qwen3_penalty_generate.safetensors")["penalty"].item<double>();
  GenerateOptions options = Greedy(static_cast<int64_t>(want[0].size()));
  options.sampling.repetition_penalty = penalty;
  auto batched = Generate(*model, prompts, options);
  ASSERT_TRUE(batched.ok()) << batched.status();
  int differs_without = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ((*batched)[i].tokens, want[i]) << "prompt " << i;
    auto alone = Generate(*model, {prompts[i]}, options);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ((*alone)[0].tokens, want[i]) << "prompt " << i << " alone";
    auto plain = Generate(*model, {prompts[i]}, Greedy(static_cast<int64_t>(want[i].size())));
    ASSERT_TRUE(plain.ok());
    differs_without += (*plain)[0].tokens != want[i];
  }
  EXPECT_GT(differs_without, 0) << "the penalty changed no output: the test would not see it";
  options.sampling.repetition_penalty = 0;
  EXPECT_EQ(Generate(*model, prompts, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GenerateTest, CachedStepsMatchOneForwardOverTheWholeSequence) {
  auto model = LoadFull("qwen3");
  ASSERT_NE(model, nullptr);
  const std::vector<int64_t> seq = {3, 17, 200, 5, 9, 41, 41, 7, 128, 64, 2};
  // Incremental: 4 tokens, then 1, then 6 (a prefill, a decode step, a verification block).
  auto cache = KvCache::Create(*model, 2, 16);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<at::Tensor> hidden, features;
  size_t at = 0;
  for (size_t n : {4, 1, 6}) {
    std::vector<int64_t> part(seq.begin() + at, seq.begin() + at + n);
    auto out = model->Extend({1}, {part}, cache->get(), true);
    ASSERT_TRUE(out.ok()) << out.status();
    hidden.push_back(out->hidden);
    features.push_back(out->features);
    at += n;
  }
  EXPECT_EQ((*cache)->length(1), 11);
  EXPECT_EQ((*cache)->length(0), 0);
  // All at once in a fresh cache, and the packed feature forward.
  auto whole_cache = KvCache::Create(*model, 1, 16);
  ASSERT_TRUE(whole_cache.ok());
  auto whole = model->Extend({0}, {seq}, whole_cache->get(), true);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const int64_t t = static_cast<int64_t>(seq.size());
  auto packed = model->Forward(at::tensor(seq, at::kLong), at::arange(t, at::kLong),
                               at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(t)},
                                          at::TensorOptions().dtype(at::kInt)));
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_TRUE(at::allclose(at::cat(hidden), whole->hidden, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(at::cat(features), whole->features, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(whole->features, *packed, 1e-5, 1e-5));
  // Truncating and re-running the dropped positions gives the same rows again.
  ASSERT_TRUE((*cache)->Truncate(1, 5).ok());
  std::vector<int64_t> tail(seq.begin() + 5, seq.end());
  auto again = model->Extend({1}, {tail}, cache->get(), false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(at::allclose(again->hidden, whole->hidden.narrow(0, 5, 6), 1e-5, 1e-5));
  EXPECT_FALSE((*cache)->Truncate(1, 12).ok());
}

TEST_F(GenerateTest, ContinuousBatchingGivesTheSameGreedyOutputs) {
  // Fewer cache rows than prompts: finished sequences hand their rows to waiting prompts, so rows
  // run out of order (the gathered path of the batched attention) and prompts of different lengths
  // share decoding steps. Greedy outputs equal transformers' at every max_batch.
  for (const std::string family : {"qwen3", "llama"}) {
    auto model = LoadFull(family);
    ASSERT_NE(model, nullptr);
    const Refs refs = ReadRefs(family);
    const int64_t n = static_cast<int64_t>(refs.outputs[0].size());
    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::vector<int64_t>> want;
    GenerateOptions options = Greedy(n);
    for (int copy = 0; copy < 3; ++copy) {
      for (size_t i = 0; i < refs.prompts.size(); ++i) {
        const int64_t limit = 1 + (copy * 7 + static_cast<int64_t>(i) * 5) % n;
        prompts.push_back(refs.prompts[i]);
        options.max_new_tokens_per_prompt.push_back(limit);
        want.emplace_back(refs.outputs[i].begin(), refs.outputs[i].begin() + limit);
      }
    }
    for (int64_t max_batch : {1, 2, 3, 5, 1000}) {
      options.max_batch = max_batch;
      auto out = Generate(*model, prompts, options);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->size(), prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ((*out)[i].tokens, want[i])
            << family << " max_batch " << max_batch << " prompt " << i;
      }
    }
  }
  auto model = LoadFull("qwen3");
  ASSERT_NE(model, nullptr);
  GenerateOptions bad = Greedy(4);
  bad.max_batch = -1;
  EXPECT_NE(Generate(*model, {{1}}, bad).status().message().find("max_batch -1"),
            std::string::npos);
}

TEST_F(GenerateTest, StopTokensEndOnlyTheirSequence) {
  auto model = LoadFull("qwen3");
  ASSERT_NE(model, nullptr);
  const Refs refs = ReadRefs("qwen3");
  GenerateOptions options = Greedy(24);
  const int64_t stop = refs.outputs[0][2];
  options.stop_token_ids = {stop};
  auto out = Generate(*model, refs.prompts, options);
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t i = 0; i < refs.prompts.size(); ++i) {
    const std::vector<int64_t>& want = refs.outputs[i];
    size_t end = 0;
    while (end < want.size() && want[end] != stop) ++end;
    const bool stops = end < want.size();
    std::vector<int64_t> expected(want.begin(), want.begin() + (stops ? end + 1 : want.size()));
    EXPECT_EQ((*out)[i].tokens, expected) << "prompt " << i;
    EXPECT_EQ((*out)[i].stopped, stops) << "prompt " << i;
  }
  EXPECT_LE((*out)[0].tokens.size(), 3u);  // the stop token is the third or earlier
  EXPECT_TRUE((*out)[0].stopped);
}

TEST_F(GenerateTest, SamplingIsSeededAndNarrowSamplingIsGreedy) {
  auto model = LoadFull("qwen3");
  ASSERT_NE(model, nullptr);
  const Refs refs = ReadRefs("qwen3");
  GenerateOptions sampled = Greedy(24);
  sampled.sampling.temperature = 1.5;
  sampled.sampling.seed = 11;
  auto a = Generate(*model, refs.prompts, sampled);
  auto b = Generate(*model, refs.prompts, sampled);
  sampled.sampling.seed = 12;
  auto c = Generate(*model, refs.prompts, sampled);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  bool differs_from_greedy = false, differs_by_seed = false;
  for (size_t i = 0; i < refs.prompts.size(); ++i) {
    EXPECT_EQ((*a)[i].tokens, (*b)[i].tokens);
    differs_from_greedy |= (*a)[i].tokens != refs.outputs[i];
    differs_by_seed |= (*a)[i].tokens != (*c)[i].tokens;
  }
  EXPECT_TRUE(differs_from_greedy);
  EXPECT_TRUE(differs_by_seed);
  // top_k 1 and a tiny top_p keep only the most likely token: greedy.
  for (int variant = 0; variant < 2; ++variant) {
    GenerateOptions narrow = sampled;
    if (variant == 0) narrow.sampling.top_k = 1;
    if (variant == 1) narrow.sampling.top_p = 1e-9;
    auto out = Generate(*model, refs.prompts, narrow);
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t i = 0; i < refs.prompts.size(); ++i) {
      EXPECT_EQ((*out)[i].tokens, refs.outputs[i]) << "variant " << variant << " prompt " << i;
    }
  }
}

TEST_F(GenerateTest, RefusesWhatItCannotRun) {
  TargetModelOptions features_only;
  features_only.dtype = at::kFloat;
  auto extractor = TargetModel::Load((oracle::OracleDir() / "qwen3").string(), features_only);
  ASSERT_TRUE(extractor.ok());
  auto no = Generate(**extractor, {{1, 2}}, Greedy(4));
  EXPECT_EQ(no.status().code(), absl::StatusCode::kFailedPrecondition) << no.status();

  auto model = LoadFull("qwen3");
  ASSERT_NE(model, nullptr);
  auto empty = Generate(*model, {{1, 2}, {}}, Greedy(4));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("prompt 1 is empty"), std::string::npos)
      << empty.status();
  auto outside = Generate(*model, {{1, 256}}, Greedy(4));
  EXPECT_NE(outside.status().message().find("token 256 is outside the vocabulary"),
            std::string::npos)
      << outside.status();
  GenerateOptions bad = Greedy(0);
  EXPECT_NE(Generate(*model, {{1}}, bad).status().message().find("max_new_tokens"),
            std::string::npos);
  bad = Greedy(4);
  bad.sampling.top_p = 0;
  EXPECT_NE(Generate(*model, {{1}}, bad).status().message().find("top_p"), std::string::npos);
  auto cache = KvCache::Create(*model, 1, 4);
  ASSERT_TRUE(cache.ok());
  auto over = model->Extend({0}, {{1, 2, 3, 4, 5}}, cache->get(), false);
  EXPECT_NE(over.status().message().find("would hold 5 positions"), std::string::npos)
      << over.status();
  auto twice = model->Extend({0, 0}, {{1}, {2}}, cache->get(), false);
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos) << twice.status();
}

}  // namespace
}  // namespace dflash::nn

// A checkpoint's generation_config.json (common/model/generation_config.h) and regen's
// --generation_config (services/coordinator/regen.h UseGenerationConfig): the sampling settings
// read as transformers defines them, errors naming the file and key, and the request refused when
// it also names settings of its own or the target is built in.
#include "common/model/generation_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "services/coordinator/regen.h"
#include "tests/data/test_files.h"

namespace dflash {
namespace {

class GenerationConfigTest : public ::testing::Test {
 protected:
  // A checkpoint directory in the test's scratch directory (removed when the test ends) with
  // `json` as its generation_config.json, or without one when `json` is empty.
  std::string Dir(const std::string& json) {
    const std::filesystem::path dir = scratch_ / ("checkpoint-" + std::to_string(++count_));
    std::filesystem::create_directories(dir);
    if (!json.empty()) data::testing::WriteFile(dir / "generation_config.json", json);
    return dir.string();
  }

 private:
  data::testing::TempDir scratch_;
  int count_ = 0;
};

TEST_F(GenerationConfigTest, ReadsTheSamplingSettingsWithTransformersDefaults) {
  auto sampled = model::ReadGenerationConfig(
      Dir(R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "eos_token_id": [1, 2]})"));
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  EXPECT_TRUE(sampled->do_sample);
  EXPECT_DOUBLE_EQ(sampled->temperature, 0.6);
  EXPECT_DOUBLE_EQ(sampled->top_p, 0.95);
  EXPECT_EQ(sampled->top_k, 50);  // transformers' default where the file is silent
  // The other ways of choosing tokens at their no-op values (as transformers writes its defaults)
  // or null are no obstacle.
  auto neutral = model::ReadGenerationConfig(Dir(
      R"({"do_sample": true, "repetition_penalty": 1.0, "num_beams": 1, "typical_p": 1.0,
          "min_p": null, "no_repeat_ngram_size": 0, "suppress_tokens": null})"));
  ASSERT_TRUE(neutral.ok()) << neutral.status();
  // Qwen2.5-Instruct's form: sampled, with a repetition penalty.
  auto qwen25 = model::ReadGenerationConfig(Dir(
      R"({"do_sample": true, "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8,
          "top_k": 20})"));
  ASSERT_TRUE(qwen25.ok()) << qwen25.status();
  EXPECT_DOUBLE_EQ(qwen25->repetition_penalty, 1.05);
  // SmolLM2-135M-Instruct's: token ids only, so greedy.
  auto silent = model::ReadGenerationConfig(Dir(R"({"bos_token_id": 1, "eos_token_id": 2})"));
  ASSERT_TRUE(silent.ok());
  EXPECT_FALSE(silent->do_sample);
}

TEST_F(GenerationConfigTest, ErrorsNameTheFileAndTheKey) {
  const std::string none = Dir("");
  EXPECT_EQ(model::ReadGenerationConfig(none).status().code(), absl::StatusCode::kNotFound);
  const struct {
    const char* json;
    const char* says;
  } bad[] = {{R"({"do_sample": "yes"})", "do_sample: not true or false"},
             {R"({"temperature": -1})", "temperature: below 0"},
             {R"({"top_p": 0})", "top_p: outside (0, 1]"},
             {R"({"top_k": 2.5})", "top_k: not an integer"},
             {R"({"repetition_penalty": 0})", "repetition_penalty: not above 0"},
             {R"({"repetition_penalty": "x"})", "repetition_penalty: not a number"},
             {R"({"do_sample": false, "num_beams": 4})", "num_beams: 4 changes"},
             {R"({"min_p": 0.0})", "min_p: 0.0 changes"},
             {R"({"no_repeat_ngram_size": 3})", "no_repeat_ngram_size: 3 changes"},
             {R"({"suppress_tokens": [5]})", "suppress_tokens: [5] changes"},
             {"[1, 2]", "not a JSON object"},
             {"{not json", "not a JSON object"}};
  for (const auto& b : bad) {
    const absl::Status s = model::ReadGenerationConfig(Dir(b.json)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.json;
    EXPECT_NE(s.message().find("generation_config.json: "), std::string::npos) << s;
    EXPECT_NE(s.message().find(b.says), std::string::npos) << s;
  }
}

TEST_F(GenerationConfigTest, RegenTakesItsSamplingFromTheTargetsFile) {
  config::RunSpec spec;
  spec.target.path = Dir(R"({"do_sample": true, "temperature": 0.7, "top_k": 20})");
  v1::RegenerateRequest req;
  req.set_generation_config(true);
  req.set_seed(9);
  ASSERT_TRUE(coordinator::UseGenerationConfig(spec, &req).ok());
  EXPECT_DOUBLE_EQ(req.temperature(), 0.7);
  EXPECT_EQ(req.top_k(), 20);
  EXPECT_EQ(coordinator::DecodingText(req), "sampled: temperature 0.7, top_p 1, top_k 20, seed 9");
  // The repetition penalty goes with the sampling settings, and with greedy decoding too.
  spec.target.path = Dir(R"({"do_sample": true, "temperature": 0.7, "repetition_penalty": 1.05})");
  v1::RegenerateRequest penalized;
  penalized.set_seed(9);
  ASSERT_TRUE(coordinator::UseGenerationConfig(spec, &penalized).ok());
  EXPECT_DOUBLE_EQ(penalized.repetition_penalty(), 1.05);
  EXPECT_EQ(coordinator::DecodingText(penalized),
            "sampled: temperature 0.7, top_p 1, top_k 50, seed 9, repetition_penalty 1.05");
  spec.target.path = Dir(R"({"do_sample": false, "repetition_penalty": 1.2})");
  v1::RegenerateRequest greedy_penalized;
  ASSERT_TRUE(coordinator::UseGenerationConfig(spec, &greedy_penalized).ok());
  EXPECT_EQ(coordinator::DecodingText(greedy_penalized), "greedy, repetition_penalty 1.2");
  v1::RegenerateRequest own_penalty;
  own_penalty.set_repetition_penalty(1.1);
  EXPECT_EQ(coordinator::UseGenerationConfig(spec, &own_penalty).code(),
            absl::StatusCode::kInvalidArgument);
  // do_sample false: greedy, whatever the temperature says.
  spec.target.path = Dir(R"({"do_sample": false, "temperature": 0.7})");
  v1::RegenerateRequest greedy;
  ASSERT_TRUE(coordinator::UseGenerationConfig(spec, &greedy).ok());
  EXPECT_EQ(coordinator::DecodingText(greedy), "greedy");
  // Settings of its own beside it, or a built-in target: refused.
  v1::RegenerateRequest both;
  both.set_temperature(0.5);
  EXPECT_EQ(coordinator::UseGenerationConfig(spec, &both).code(),
            absl::StatusCode::kInvalidArgument);
  spec.target.path = "builtin:tiny-qwen3";
  const absl::Status builtin = coordinator::UseGenerationConfig(spec, &greedy);
  EXPECT_EQ(builtin.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(builtin.message().find("built-in model"), std::string::npos) << builtin;
}

}  // namespace
}  // namespace dflash

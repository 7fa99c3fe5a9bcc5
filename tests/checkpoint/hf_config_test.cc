#include "common/model/hf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/checkpoint/test_files.h"

namespace dflash::model {
namespace {

using ::dflash::model::testing::TempDir;
using ::dflash::model::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Qwen/Qwen3-8B config.json as published.
constexpr const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// meta-llama/Llama-3.1-8B config.json as published.
constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// A DFlash drafter for Qwen3-8B as transformers 4.57 writes it ("dtype", layer_types).
constexpr const char* kDrafter = R"({
  "architectures": ["DFlashDraftModel"],
  "attention_bias": false,
  "block_size": 16,
  "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
  "dtype": "bfloat16",
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 12288,
  "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention",
                  "full_attention"],
  "max_position_embeddings": 40960,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 5,
  "num_key_value_heads": 8,
  "num_target_layers": 36,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "tie_word_embeddings": false,
  "vocab_size": 151936
})";

TEST(HfConfig, Qwen3_8B) {
  auto cfg = ParseHfConfig(kQwen3_8B, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->model_type, "qwen3");
  EXPECT_THAT(cfg->architectures, ElementsAre("Qwen3ForCausalLM"));
  EXPECT_EQ(cfg->vocab_size, 151936);
  EXPECT_EQ(cfg->hidden_size, 4096);
  EXPECT_EQ(cfg->intermediate_size, 12288);
  EXPECT_EQ(cfg->num_hidden_layers, 36);
  EXPECT_EQ(cfg->num_attention_heads, 32);
  EXPECT_EQ(cfg->num_key_value_heads, 8);
  EXPECT_EQ(cfg->head_dim, 128);
  EXPECT_EQ(cfg->max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(cfg->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 1e6);
  EXPECT_FALSE(cfg->rope_scaling.has_value());
  EXPECT_FALSE(cfg->tie_word_embeddings);
  EXPECT_FALSE(cfg->attention_bias);
  EXPECT_TRUE(cfg->qk_norm);
  EXPECT_EQ(cfg->torch_dtype, "bfloat16");
  EXPECT_EQ(cfg->block_size, 0);
  EXPECT_FALSE(cfg->mask_token_id.has_value());
  EXPECT_FALSE(cfg->target_layer_ids.has_value());
}

TEST(HfConfig, Llama31_8B) {
  auto cfg = ParseHfConfig(kLlama31_8B, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->model_type, "llama");
  EXPECT_FALSE(cfg->qk_norm);
  EXPECT_EQ(cfg->head_dim, 128);  // hidden_size / num_attention_heads
  EXPECT_EQ(cfg->num_key_value_heads, 8);
  EXPECT_EQ(cfg->intermediate_size, 14336);
  EXPECT_DOUBLE_EQ(cfg->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 500000.0);
  ASSERT_TRUE(cfg->rope_scaling.has_value());
  EXPECT_EQ(cfg->rope_scaling->rope_type, "llama3");
  EXPECT_DOUBLE_EQ(cfg->rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(cfg->rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(cfg->rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(cfg->rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_FALSE(cfg->mlp_bias);
}

TEST(HfConfig, DFlashDrafter) {
  auto cfg = ParseHfConfig(kDrafter, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->num_hidden_layers, 5);
  EXPECT_EQ(cfg->block_size, 16);
  EXPECT_EQ(cfg->num_target_layers, 36);
  EXPECT_EQ(cfg->mask_token_id, 151669);
  ASSERT_TRUE(cfg->target_layer_ids.has_value());
  EXPECT_THAT(*cfg->target_layer_ids, ElementsAre(1, 9, 17, 25, 33));
  EXPECT_EQ(cfg->torch_dtype, "bfloat16");  // from "dtype"
}

// A DFlash2DraftModel (docs/method.md §2.2): its settings in dflash_config or at the top level (as
// the reference package reads them), the output head's scales with their defaults, and a missing
// setting named.
TEST(HfConfig, DFlash2Drafter) {
  nlohmann::json j = nlohmann::json::parse(kDrafter);
  auto plain = ParseHfConfig(j.dump(), "config.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->conv_kernel_size, 0);
  EXPECT_EQ(plain->output_multiplier, 1.0);
  EXPECT_EQ(plain->final_logit_softcapping, 0.0);
  j["architectures"] = {"DFlash2DraftModel"};
  j["dflash_config"]["conv_kernel_size"] = 2;
  j["dflash_config"]["conv_group_size"] = 16;
  j["dflash_config"]["selector_rank"] = 256;
  j["selector_top_k"] = 16;  // top level
  j["dflash_config"]["output_multiplier"] = 1.5;
  j["final_logit_softcapping"] = 30;
  auto cfg = ParseHfConfig(j.dump(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->conv_kernel_size, 2);
  EXPECT_EQ(cfg->conv_group_size, 16);
  EXPECT_EQ(cfg->selector_rank, 256);
  EXPECT_EQ(cfg->selector_top_k, 16);
  EXPECT_EQ(cfg->output_multiplier, 1.5);
  EXPECT_EQ(cfg->final_logit_softcapping, 30.0);
  EXPECT_EQ(cfg->input_embedding_scale, 1.0);
  j["dflash_config"].erase("selector_rank");
  auto missing = ParseHfConfig(j.dump(), "config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("selector_rank: required"));
  j["dflash_config"]["selector_rank"] = 256;
  j["dflash_config"]["output_multiplier"] = -1;
  auto negative = ParseHfConfig(j.dump(), "config.json");
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(std::string(negative.status().message()),
              HasSubstr("dflash_config.output_multiplier: must be a positive number"));
}

TEST(HfConfig, Defaults) {
  auto cfg = ParseHfConfig(R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
      "head_dim": null, "unknown_field": {"anything": [1, 2]}})",
                           "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->num_key_value_heads, 4);
  EXPECT_EQ(cfg->head_dim, 64);
  EXPECT_DOUBLE_EQ(cfg->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 10000.0);
  EXPECT_EQ(cfg->max_position_embeddings, 32768);
  EXPECT_FALSE(cfg->tie_word_embeddings);
  EXPECT_FALSE(cfg->rope_scaling.has_value());
  EXPECT_TRUE(cfg->architectures.empty());
  EXPECT_TRUE(cfg->torch_dtype.empty());

  // Qwen3 keeps head_dim independent of hidden_size / heads (Qwen3-0.6B: 1024 / 16 != 128).
  cfg = ParseHfConfig(R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 1024,
      "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 16,
      "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": true,
      "rope_scaling": {"rope_type": "default"}})",
                      "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->head_dim, 128);
  EXPECT_TRUE(cfg->tie_word_embeddings);
  EXPECT_FALSE(cfg->rope_scaling.has_value());
}

// transformers 5 writes rope_theta and the scaling into one "rope_parameters" object.
TEST(HfConfig, Transformers5RopeParameters) {
  nlohmann::json j = nlohmann::json::parse(kLlama31_8B);
  j["rope_parameters"] = j["rope_scaling"];
  j["rope_parameters"]["rope_theta"] = 250000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  auto cfg = ParseHfConfig(j.dump(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 250000.0);
  ASSERT_TRUE(cfg->rope_scaling.has_value());
  EXPECT_EQ(cfg->rope_scaling->rope_type, "llama3");
  EXPECT_DOUBLE_EQ(cfg->rope_scaling->factor, 8.0);
  EXPECT_EQ(cfg->rope_scaling->original_max_position_embeddings, 8192);

  cfg = ParseHfConfig(R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})",
                      "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 1e6);
  EXPECT_FALSE(cfg->rope_scaling.has_value());

  cfg = ParseHfConfig(R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "yarn", "factor": 4.0}})",
                      "config.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              HasSubstr("config.json: rope_parameters.rope_type: unsupported rope scaling 'yarn'"));
}

TEST(HfConfig, LoadFromDirectory) {
  TempDir dir;
  auto missing = LoadHfConfig(dir.path());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir.Join("config.json")));
  WriteFile(dir.Join("config.json"), kQwen3_8B);
  auto cfg = LoadHfConfig(dir.path());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->hidden_size, 4096);
  WriteFile(dir.Join("config.json"), R"({"model_type": "qwen3"})");
  EXPECT_THAT(std::string(LoadHfConfig(dir.path()).status().message()),
              HasSubstr(dir.Join("config.json") + ": vocab_size: required"));
}

struct BadField {
  const char* name;  // the test's name
  const char* base;  // kQwen3_8B, kLlama31_8B or kDrafter
  const char* json_pointer;
  const char* value;  // JSON text; empty: remove the field
  const char* message;
};

void PrintTo(const BadField& p, std::ostream* os) { *os << p.name; }

std::string BadFieldName(const ::testing::TestParamInfo<BadField>& info) { return info.param.name; }

class HfConfigBadField : public ::testing::TestWithParam<BadField> {};

TEST_P(HfConfigBadField, NamesFileAndField) {
  const BadField& p = GetParam();
  nlohmann::json j = nlohmann::json::parse(p.base);
  nlohmann::json::json_pointer ptr(p.json_pointer);
  if (std::string(p.value).empty()) {
    j[ptr.parent_pointer()].erase(ptr.back());
  } else {
    j[ptr] = nlohmann::json::parse(p.value);
  }
  auto cfg = ParseHfConfig(j.dump(), "config.json");
  ASSERT_FALSE(cfg.ok()) << p.json_pointer << " = " << p.value;
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(cfg.status().message()), p.message);
}

INSTANTIATE_TEST_SUITE_P(
    Qwen3, HfConfigBadField,
    ::testing::Values(
        BadField{"num_attention_heads_12", kQwen3_8B, "/num_attention_heads", "12",
                 "config.json: num_attention_heads: must be divisible by num_key_value_heads (8), "
                 "got 12"},
        BadField{
            "model_type_mistral", kQwen3_8B, "/model_type", "\"mistral\"",
            "config.json: model_type: unsupported 'mistral' (supported: qwen3, qwen3_moe, llama, "
            "qwen3_next, qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text)"},
        BadField{"model_type_missing", kQwen3_8B, "/model_type", "",
                 "config.json: model_type: required"},
        BadField{"hidden_size_0", kQwen3_8B, "/hidden_size", "0",
                 "config.json: hidden_size: must be in 1..131072, got 0"},
        BadField{"hidden_size_missing", kQwen3_8B, "/hidden_size", "",
                 "config.json: hidden_size: required"},
        BadField{"vocab_size_negative", kQwen3_8B, "/vocab_size", "-5",
                 "config.json: vocab_size: must be in 1..16777216, got -5"},
        BadField{"vocab_size_string", kQwen3_8B, "/vocab_size", "\"151936\"",
                 "config.json: vocab_size: must be an integer, got \"151936\""},
        BadField{"vocab_size_float", kQwen3_8B, "/vocab_size", "151936.5",
                 "config.json: vocab_size: must be an integer, got 151936.5"},
        BadField{"vocab_size_huge", kQwen3_8B, "/vocab_size", "18446744073709551615",
                 "config.json: vocab_size: must be in 1..16777216, got 18446744073709551615"},
        BadField{"num_hidden_layers_0", kQwen3_8B, "/num_hidden_layers", "0",
                 "config.json: num_hidden_layers: must be in 1..1024, got 0"},
        BadField{"num_hidden_layers_1025", kQwen3_8B, "/num_hidden_layers", "1025",
                 "config.json: num_hidden_layers: must be in 1..1024, got 1025"},
        BadField{"num_key_value_heads_0", kQwen3_8B, "/num_key_value_heads", "0",
                 "config.json: num_key_value_heads: must be in 1..1024, got 0"},
        BadField{"head_dim_127", kQwen3_8B, "/head_dim", "127",
                 "config.json: head_dim: must be even, got 127"},
        BadField{"intermediate_size_missing", kQwen3_8B, "/intermediate_size", "",
                 "config.json: intermediate_size: required"},
        BadField{"rms_norm_eps_0", kQwen3_8B, "/rms_norm_eps", "0",
                 "config.json: rms_norm_eps: must be a positive number, got 0"},
        BadField{"rope_theta_string", kQwen3_8B, "/rope_theta", "\"1e6\"",
                 "config.json: rope_theta: must be a number, got \"1e6\""},
        BadField{"tie_word_embeddings_1", kQwen3_8B, "/tie_word_embeddings", "1",
                 "config.json: tie_word_embeddings: must be true or false, got 1"},
        BadField{"attention_bias_no", kQwen3_8B, "/attention_bias", "\"no\"",
                 "config.json: attention_bias: must be true or false, got \"no\""},
        BadField{"architectures_string", kQwen3_8B, "/architectures", "\"Qwen3ForCausalLM\"",
                 "config.json: architectures: must be a list of strings, got "
                 "\"Qwen3ForCausalLM\""},
        BadField{"torch_dtype_16", kQwen3_8B, "/torch_dtype", "16",
                 "config.json: torch_dtype: must be a string, got 16"},
        BadField{"use_sliding_window_true", kQwen3_8B, "/use_sliding_window", "true",
                 "config.json: use_sliding_window: sliding-window attention is not supported"},
        BadField{"hidden_act_gelu", kQwen3_8B, "/hidden_act", "\"gelu\"",
                 "config.json: hidden_act: only silu (SwiGLU) is supported, got 'gelu'"},
        BadField{"rope_scaling_yarn", kQwen3_8B, "/rope_scaling",
                 "{\"rope_type\": \"yarn\", \"factor\": 4.0}",
                 "config.json: rope_scaling.rope_type: unsupported rope scaling 'yarn' "
                 "(supported: llama3, default)"},
        BadField{"rope_scaling_empty_list", kQwen3_8B, "/rope_scaling", "[]",
                 "config.json: rope_scaling: must be an object or null, got []"}),
    BadFieldName);

INSTANTIATE_TEST_SUITE_P(
    Llama, HfConfigBadField,
    ::testing::Values(
        BadField{"rope_type_missing", kLlama31_8B, "/rope_scaling/rope_type", "",
                 "config.json: rope_scaling.type: required"},
        BadField{"rope_scaling_dynamic", kLlama31_8B, "/rope_scaling",
                 "{\"type\": \"dynamic\", \"factor\": 2.0}",
                 "config.json: rope_scaling.type: unsupported rope scaling 'dynamic' (supported: "
                 "llama3, default)"},
        BadField{"factor_missing", kLlama31_8B, "/rope_scaling/factor", "",
                 "config.json: rope_scaling.factor: required"},
        BadField{"factor_0_5", kLlama31_8B, "/rope_scaling/factor", "0.5",
                 "config.json: rope_scaling.factor: must be at least 1, got 0.5"},
        BadField{"high_freq_factor_1_0", kLlama31_8B, "/rope_scaling/high_freq_factor", "1.0",
                 "config.json: rope_scaling.high_freq_factor: must be greater than "
                 "low_freq_factor (1), got 1"},
        BadField{"original_max_position_embeddings_0", kLlama31_8B,
                 "/rope_scaling/original_max_position_embeddings", "0",
                 "config.json: rope_scaling.original_max_position_embeddings: must be in "
                 "1..1073741824, got 0"},
        BadField{"hidden_size_4100", kLlama31_8B, "/hidden_size", "4100",
                 "config.json: head_dim: absent, and hidden_size (4100) is not divisible by "
                 "num_attention_heads (32)"}),
    BadFieldName);

INSTANTIATE_TEST_SUITE_P(
    Drafter, HfConfigBadField,
    ::testing::Values(
        BadField{"block_size_missing", kDrafter, "/block_size", "",
                 "config.json: block_size: required"},
        BadField{"block_size_0", kDrafter, "/block_size", "0",
                 "config.json: block_size: must be in 1..1024, got 0"},
        BadField{"num_target_layers_missing", kDrafter, "/num_target_layers", "",
                 "config.json: num_target_layers: required"},
        BadField{"target_layer_ids_out_of_range", kDrafter, "/dflash_config/target_layer_ids/4",
                 "36",
                 "config.json: dflash_config.target_layer_ids: each id must be an integer in "
                 "0..35 (num_target_layers - 1), got 36"},
        BadField{"target_layer_ids_negative", kDrafter, "/dflash_config/target_layer_ids/0", "-1",
                 "config.json: dflash_config.target_layer_ids: each id must be an integer in "
                 "0..35 (num_target_layers - 1), got -1"},
        BadField{"target_layer_ids_duplicate", kDrafter, "/dflash_config/target_layer_ids/1", "1",
                 "config.json: dflash_config.target_layer_ids: layer 1 is listed twice"},
        BadField{"target_layer_ids_empty_list", kDrafter, "/dflash_config/target_layer_ids", "[]",
                 "config.json: dflash_config.target_layer_ids: must be a non-empty list of layer "
                 "ids, got []"},
        BadField{"mask_token_id_151936", kDrafter, "/dflash_config/mask_token_id", "151936",
                 "config.json: dflash_config.mask_token_id: must be in 0..151935, got 151936"},
        BadField{"dflash_config_not_object", kDrafter, "/dflash_config", "[1]",
                 "config.json: dflash_config: must be an object, got [1]"},
        BadField{"layer_types_2_linear_attention", kDrafter, "/layer_types/2",
                 "\"linear_attention\"",
                 "config.json: layer_types: layer 2 is 'linear_attention'; a drafter layer is "
                 "full_attention or sliding_attention"},
        BadField{"layer_types_4_of_5", kDrafter, "/layer_types",
                 "[\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\"]",
                 "config.json: layer_types: lists 4 layers; num_hidden_layers is 5"},
        BadField{"is_causal", kDrafter, "/is_causal", "true",
                 "config.json: is_causal: not supported (sliding layers are causal inside the "
                 "block, full layers are not, as the reference package does without it)"},
        BadField{"target_sliding_window", kQwen3_8B, "/use_sliding_window", "true",
                 "config.json: use_sliding_window: sliding-window attention is not supported"}),
    BadFieldName);

// A drafter's sliding layers as transformers' Qwen3Config reads them (the reference package
// builds its layers from that): layer_types as written; without layer_types, sliding from
// max_window_layers on; the window only with use_sliding_window.
TEST(HfConfig, DrafterSlidingLayers) {
  nlohmann::json j = nlohmann::json::parse(kDrafter);
  j["layer_types"][1] = "sliding_attention";
  j["layer_types"][3] = "sliding_attention";
  j["sliding_window"] = 2048;
  j["use_sliding_window"] = true;
  auto cfg = ParseHfConfig(j.dump(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_THAT(cfg->layer_types, ElementsAre("full_attention", "sliding_attention", "full_attention",
                                            "sliding_attention", "full_attention"));
  EXPECT_EQ(cfg->sliding_window, 2048);
  j["use_sliding_window"] = false;  // Qwen3Config drops the window: causal only
  cfg = ParseHfConfig(j.dump(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->sliding_window, 0);
  EXPECT_EQ(cfg->layer_types[1], "sliding_attention");
  j.erase("layer_types");
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 3;
  cfg = ParseHfConfig(j.dump(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_THAT(cfg->layer_types, ElementsAre("full_attention", "full_attention", "full_attention",
                                            "sliding_attention", "sliding_attention"));
  j["sliding_window"] = 0;
  EXPECT_EQ(std::string(ParseHfConfig(j.dump(), "config.json").status().message()),
            "config.json: sliding_window: must be in 1..1073741824, got 0");
}

TEST(HfConfig, NotJsonOrNotAnObject) {
  auto cfg = ParseHfConfig("{\"model_type\": ", "config.json");
  EXPECT_THAT(std::string(cfg.status().message()), HasSubstr("config.json: not valid JSON"));
  cfg = ParseHfConfig("[1]", "config.json");
  EXPECT_EQ(std::string(cfg.status().message()), "config.json: must be a JSON object, got array");
}

TEST(DefaultTargetLayerIds, PublishedDrafters) {
  EXPECT_THAT(DefaultTargetLayerIds(36, 5), ElementsAre(1, 9, 17, 25, 33));  // Qwen3-8B
  EXPECT_THAT(DefaultTargetLayerIds(28, 5), ElementsAre(1, 7, 13, 19, 25));  // Qwen3-1.7B
  EXPECT_THAT(DefaultTargetLayerIds(32, 5), ElementsAre(1, 8, 15, 22, 29));  // Llama-3.1-8B
  EXPECT_THAT(DefaultTargetLayerIds(36, 1), ElementsAre(18));
  EXPECT_THAT(DefaultTargetLayerIds(7, 1), ElementsAre(3));
  EXPECT_THAT(DefaultTargetLayerIds(6, 3), ElementsAre(1, 2, 3));
}

TEST(DefaultTargetLayerIds, TiesRoundHalfToEven) {
  EXPECT_THAT(DefaultTargetLayerIds(7, 3), ElementsAre(1, 2, 4));  // 1 + 1.5 = 2.5 -> 2
  EXPECT_THAT(DefaultTargetLayerIds(9, 3), ElementsAre(1, 4, 6));  // 1 + 2.5 = 3.5 -> 4
  EXPECT_THAT(DefaultTargetLayerIds(5, 3), ElementsAre(1, 2, 2));  // 1.5 -> 2
}

// round_half_even((k - 1 + i * span) / (k - 1)) in exact integer arithmetic.
int64_t ExactRule(int64_t layers, int64_t k, int64_t i) {
  const int64_t q = k - 1;
  const int64_t p = q + i * (layers - 4);
  int64_t fl = p / q, r = p % q;
  if (2 * r > q || (2 * r == q && fl % 2 != 0)) ++fl;
  return fl;
}

TEST(DefaultTargetLayerIds, MatchesExactArithmetic) {
  for (int64_t layers = 5; layers <= 160; ++layers) {
    for (int64_t k = 2; k <= 12; ++k) {
      std::vector<int64_t> ids = DefaultTargetLayerIds(layers, k);
      ASSERT_EQ(ids.size(), static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) {
        ASSERT_EQ(ids[i], ExactRule(layers, k, i)) << "L=" << layers << " K=" << k << " i=" << i;
        ASSERT_LT(ids[i], layers);
      }
    }
  }
  EXPECT_TRUE(DefaultTargetLayerIds(36, 0).empty());
}

}  // namespace
}  // namespace dflash::model

namespace dflash::model {
namespace {

// Qwen/Qwen3-30B-A3B config.json as published (the fields dflash reads, and some it ignores).
constexpr const char* kQwen3_30B_A3B = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "decoder_sparse_step": 1,
  "head_dim": 128,
  "hidden_size": 2048,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 151936
})";

TEST(HfConfig, Qwen3_30B_A3B) {
  auto cfg = ParseHfConfig(kQwen3_30B_A3B, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->model_type, "qwen3_moe");
  EXPECT_TRUE(cfg->qk_norm);
  EXPECT_EQ(cfg->num_experts, 128);
  EXPECT_EQ(cfg->num_experts_per_tok, 8);
  EXPECT_EQ(cfg->moe_intermediate_size, 768);
  EXPECT_EQ(cfg->decoder_sparse_step, 1);
  EXPECT_TRUE(cfg->norm_topk_prob);
  EXPECT_TRUE(cfg->mlp_only_layers.empty());
  for (int64_t i = 0; i < 48; ++i) EXPECT_TRUE(IsMoeLayer(*cfg, i)) << i;
  // transformers 5 writes the expert count as num_local_experts.
  nlohmann::json v5 = nlohmann::json::parse(kQwen3_30B_A3B);
  v5.erase("num_experts");
  v5["num_local_experts"] = 128;
  auto five = ParseHfConfig(v5.dump(), "config.json");
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(five->num_experts, 128);
}

TEST(HfConfig, MoeLayersFollowSparseStepAndMlpOnlyLayers) {
  nlohmann::json j = nlohmann::json::parse(kQwen3_30B_A3B);
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto cfg = ParseHfConfig(j.dump(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_FALSE(IsMoeLayer(*cfg, 0));
  EXPECT_TRUE(IsMoeLayer(*cfg, 1));
  EXPECT_FALSE(IsMoeLayer(*cfg, 2));
  EXPECT_FALSE(IsMoeLayer(*cfg, 3));  // mlp_only
  EXPECT_TRUE(IsMoeLayer(*cfg, 5));
  auto dense = ParseHfConfig(kQwen3_8B, "config.json");
  ASSERT_TRUE(dense.ok());
  EXPECT_FALSE(IsMoeLayer(*dense, 1));
}

TEST(HfConfig, MoeErrorsNameTheField) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j.erase("num_experts"); },
       "config.json: num_experts: required (or num_local_experts)"},
      {[](nlohmann::json& j) { j["num_experts_per_tok"] = 129; },
       "num_experts_per_tok: must be in 1..128, got 129"},
      {[](nlohmann::json& j) { j["moe_intermediate_size"] = "768"; },
       "moe_intermediate_size: must be an integer"},
      {[](nlohmann::json& j) { j["mlp_only_layers"] = {48}; },
       "mlp_only_layers: must hold layer ids in 0..47, got 48"},
      {[](nlohmann::json& j) { j["shared_expert_intermediate_size"] = 512; },
       "shared_expert_intermediate_size: shared experts are not supported"},
      {[](nlohmann::json& j) { j["model_type"] = "qwen2_moe"; },
       "unsupported 'qwen2_moe' (supported: qwen3, qwen3_moe, llama, qwen3_next"},
  };
  for (const auto& [mutate, want] : cases) {
    nlohmann::json j = nlohmann::json::parse(kQwen3_30B_A3B);
    mutate(j);
    auto cfg = ParseHfConfig(j.dump(), "config.json");
    ASSERT_FALSE(cfg.ok()) << want;
    EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(want));
  }
}

// Qwen/Qwen3.5-27B's config.json (a vision-language checkpoint), less its vision config and the
// fields dflash ignores.
constexpr const char* kQwen35_27B = R"({
  "architectures": ["Qwen3_5ForConditionalGeneration"],
  "model_type": "qwen3_5",
  "tie_word_embeddings": false,
  "text_config": {
    "attn_output_gate": true, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 17408, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "model_type": "qwen3_5_text", "num_attention_heads": 24, "num_hidden_layers": 64,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "vocab_size": 248320,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                        "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}
  }
})";

TEST(HfConfig, Qwen35_27B) {
  auto cfg = ParseHfConfig(kQwen35_27B, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->model_type, "qwen3_5");
  EXPECT_EQ(cfg->weight_prefix, "model.language_model.");
  EXPECT_EQ(cfg->hidden_size, 5120);
  EXPECT_EQ(cfg->head_dim, 256);
  EXPECT_EQ(RotaryDim(*cfg), 64);
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 1e7);
  EXPECT_TRUE(cfg->attn_output_gate);
  EXPECT_TRUE(cfg->zero_centered_norm);
  EXPECT_FALSE(cfg->fused_linear_projections);
  EXPECT_EQ(cfg->linear_num_value_heads, 48);
  EXPECT_EQ(cfg->num_experts, 0);
  ASSERT_EQ(cfg->layer_types.size(), 64u);
  int linear = 0;
  for (int64_t i = 0; i < 64; ++i) linear += IsLinearAttentionLayer(*cfg, i) ? 1 : 0;
  EXPECT_EQ(linear, 48);  // every fourth layer is full attention: 3, 7, ..., 63
  EXPECT_FALSE(IsLinearAttentionLayer(*cfg, 3));
  EXPECT_TRUE(IsLinearAttentionLayer(*cfg, 4));
  EXPECT_TRUE(IsHybrid(*cfg));
}

TEST(HfConfig, HybridErrorsNameTheField) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j.erase("text_config"); },
       "config.json: text_config: required: the language model's config of a qwen3_5"},
      {[](nlohmann::json& j) { j["text_config"]["layer_types"] = {"linear_attention"}; },
       "config.json: text_config.layer_types: lists 1 layers; num_hidden_layers is 64"},
      {[](nlohmann::json& j) {
         j["text_config"]["layer_types"] = std::vector<std::string>(64, "full_attention");
         j["text_config"]["layer_types"][5] = "sliding_attention";
       },
       "text_config.layer_types: layer 5 is 'sliding_attention'; expected linear_attention or "
       "full_attention"},
      {[](nlohmann::json& j) { j["text_config"]["linear_num_value_heads"] = 40; },
       "text_config.linear_num_value_heads: must be a multiple of linear_num_key_heads (16), got "
       "40"},
      {[](nlohmann::json& j) {
         j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 1.5;
       },
       "text_config.partial_rotary_factor: must give an even number of rotated dimensions"},
      {[](nlohmann::json& j) { j["text_config"].erase("intermediate_size"); },
       "text_config.intermediate_size: required"},
      {[](nlohmann::json& j) {
         j["model_type"] = "qwen3_5_moe";
         j["text_config"]["num_experts"] = 256;
         j["text_config"]["num_experts_per_tok"] = 8;
         j["text_config"]["moe_intermediate_size"] = 512;
       },
       "text_config.shared_expert_intermediate_size: required"},
  };
  for (const auto& [mutate, want] : cases) {
    nlohmann::json j = nlohmann::json::parse(kQwen35_27B);
    mutate(j);
    auto cfg = ParseHfConfig(j.dump(), "config.json");
    ASSERT_FALSE(cfg.ok()) << want;
    EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(want));
  }
}

TEST(HfConfig, HybridMoeAndTextOnlyForms) {
  nlohmann::json moe = nlohmann::json::parse(kQwen35_27B);
  moe["model_type"] = "qwen3_5_moe";
  moe["text_config"].erase("intermediate_size");  // Qwen3.5-MoE has no dense MLP
  moe["text_config"]["num_experts"] = 256;
  moe["text_config"]["num_experts_per_tok"] = 8;
  moe["text_config"]["moe_intermediate_size"] = 512;
  moe["text_config"]["shared_expert_intermediate_size"] = 512;
  auto cfg = ParseHfConfig(moe.dump(), "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->norm_topk_prob);
  EXPECT_EQ(cfg->shared_expert_intermediate_size, 512);
  EXPECT_TRUE(IsMoeLayer(*cfg, 0) && IsMoeLayer(*cfg, 63));

  // The text-only form: the text config itself, tensors under model.*; no layer_types means
  // full_attention_interval (here 2).
  nlohmann::json text = nlohmann::json::parse(kQwen35_27B)["text_config"];
  text["full_attention_interval"] = 2;
  auto t = ParseHfConfig(text.dump(), "config.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->model_type, "qwen3_5_text");
  EXPECT_EQ(t->weight_prefix, "model.");
  EXPECT_TRUE(IsLinearAttentionLayer(*t, 0));
  EXPECT_FALSE(IsLinearAttentionLayer(*t, 1));

  // Qwen3-Next (transformers 4.x): partial_rotary_factor at the top level, fused projections,
  // norm_topk_prob true unless written otherwise.
  text["model_type"] = "qwen3_next";
  text.erase("rope_parameters");
  text["rope_theta"] = 10000000;
  text["partial_rotary_factor"] = 0.5;
  text["num_experts"] = 512;
  text["num_experts_per_tok"] = 10;
  text["moe_intermediate_size"] = 512;
  text["shared_expert_intermediate_size"] = 512;
  auto next = ParseHfConfig(text.dump(), "config.json");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(RotaryDim(*next), 128);
  EXPECT_TRUE(next->fused_linear_projections);
  EXPECT_TRUE(next->norm_topk_prob);
}

}  // namespace
}  // namespace dflash::model

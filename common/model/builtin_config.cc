#include "common/model/builtin_config.h"

#include "absl/strings/str_cat.h"
#include "common/config/builtins.h"
#include "common/model/hf_config.h"

namespace dflash::model {

using config::TinyQwen3;

namespace {

// Qwen3-8B's config.json shape (the GPU benchmarks' target), weights random.
TransformerConfig Qwen3_8B() {
  TransformerConfig t;
  t.model_type = "qwen3";
  t.architectures = {"Qwen3ForCausalLM"};
  t.vocab_size = 151936;
  t.hidden_size = 4096;
  t.intermediate_size = 12288;
  t.num_hidden_layers = 36;
  t.num_attention_heads = 32;
  t.num_key_value_heads = 8;
  t.head_dim = 128;
  t.max_position_embeddings = 40960;
  t.rope_theta = 1000000.0;
  t.rms_norm_eps = 1e-6;
  t.qk_norm = true;
  t.torch_dtype = "bfloat16";
  t.mask_token_id = kQwen3MaskTokenId;
  return t;
}

// Qwen/Qwen3.5-27B's text backbone (its config.json's text_config less the fields dflash ignores;
// Qwen3.6-27B has the same shape): a hybrid of 48 gated delta-rule layers and 16 gated-attention
// layers, weights random. A random model has no special tokens: the mask token is the last id.
absl::StatusOr<TransformerConfig> Qwen3_5_27B() {
  constexpr const char* kText = R"({"model_type": "qwen3_5_text", "vocab_size": 248320,
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
    "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "max_position_embeddings": 262144, "mask_token_id": 248319,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25}, "tie_word_embeddings": false})";
  return ParseHfConfig(kText, "builtin:qwen3.5-27b-random");
}

}  // namespace

absl::StatusOr<TransformerConfig> BuiltinTargetConfig(const std::string& name) {
  if (name == "qwen3-8b-random") return Qwen3_8B();
  if (name == "qwen3.5-27b-random") return Qwen3_5_27B();
  if (name != "tiny-qwen3") {
    return absl::NotFoundError(
        absl::StrCat("unknown built-in target '", name,
                     "' (known: tiny-qwen3, qwen3-8b-random, qwen3.5-27b-random)"));
  }
  TransformerConfig t;
  t.model_type = "qwen3";
  t.architectures = {"Qwen3ForCausalLM"};
  t.vocab_size = TinyQwen3::kVocabSize;
  t.hidden_size = TinyQwen3::kHiddenSize;
  t.intermediate_size = TinyQwen3::kIntermediateSize;
  t.num_hidden_layers = TinyQwen3::kLayers;
  t.num_attention_heads = TinyQwen3::kHeads;
  t.num_key_value_heads = TinyQwen3::kKvHeads;
  t.head_dim = TinyQwen3::kHeadDim;
  t.max_position_embeddings = TinyQwen3::kMaxPositions;
  t.rope_theta = TinyQwen3::kRopeTheta;
  t.qk_norm = true;
  t.torch_dtype = "float32";
  t.mask_token_id = TinyQwen3::kMaskTokenId;
  return t;
}

}  // namespace dflash::model

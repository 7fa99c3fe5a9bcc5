#include "common/model/builtin_config.h"

#include "absl/strings/str_cat.h"
#include "common/config/builtins.h"

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

}  // namespace

absl::StatusOr<TransformerConfig> BuiltinTargetConfig(const std::string& name) {
  if (name == "qwen3-8b-random") return Qwen3_8B();
  if (name != "tiny-qwen3") {
    return absl::NotFoundError(
        absl::StrCat("unknown built-in target '", name, "' (known: tiny-qwen3, qwen3-8b-random)"));
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

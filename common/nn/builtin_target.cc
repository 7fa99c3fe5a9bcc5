#include "common/nn/builtin_target.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/config/builtins.h"

namespace dflash::nn {

using config::TinyQwen3;

absl::StatusOr<model::TransformerConfig> BuiltinTargetConfig(const std::string& name) {
  if (name != "tiny-qwen3") {
    return absl::NotFoundError(
        absl::StrCat("unknown built-in target '", name, "' (known: tiny-qwen3)"));
  }
  model::TransformerConfig t;
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
  return t;
}

absl::StatusOr<std::unique_ptr<TargetModel>> BuiltinTarget(const std::string& name,
                                                           const TargetModelOptions& options) {
  absl::StatusOr<model::TransformerConfig> config = BuiltinTargetConfig(name);
  if (!config.ok()) return config.status();
  const model::TransformerConfig& t = *config;
  at::Generator gen = at::detail::createCPUGenerator(TinyQwen3::kWeightSeed);
  // Drawn in a fixed order (std::map below is only the container): the values depend on the seed
  // and on LibTorch's generator, not on the order the model reads them.
  auto matrix = [&](int64_t out, int64_t in) {
    return at::randn({out, in}, gen, at::kFloat) / std::sqrt(static_cast<double>(in));
  };
  const int64_t h = t.hidden_size, d = t.head_dim, inter = t.intermediate_size;
  const int64_t q = t.num_attention_heads * d, kv = t.num_key_value_heads * d;
  std::map<std::string, at::Tensor> w;
  w["model.embed_tokens.weight"] = at::randn({t.vocab_size, h}, gen, at::kFloat);
  // Sharp logits, as a trained model's lm_head gives: with the drafter's normed hidden state
  // (RMS 1) each logit has a standard deviation of 4, so the drafter, whose lm_head is this frozen
  // one, can express confident predictions without first growing its final norm.
  w["lm_head.weight"] = at::randn({t.vocab_size, h}, gen, at::kFloat) * 0.5;
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    w[p + "input_layernorm.weight"] = at::ones({h});
    w[p + "post_attention_layernorm.weight"] = at::ones({h});
    w[p + "self_attn.q_norm.weight"] = at::ones({d});
    w[p + "self_attn.k_norm.weight"] = at::ones({d});
    w[p + "self_attn.q_proj.weight"] = matrix(q, h);
    w[p + "self_attn.k_proj.weight"] = matrix(kv, h);
    w[p + "self_attn.v_proj.weight"] = matrix(kv, h);
    w[p + "self_attn.o_proj.weight"] = matrix(h, q);
    w[p + "mlp.gate_proj.weight"] = matrix(inter, h);
    w[p + "mlp.up_proj.weight"] = matrix(inter, h);
    w[p + "mlp.down_proj.weight"] = matrix(h, inter);
  }
  w["model.norm.weight"] = at::ones({h});
  return TargetModel::FromTensors(t, w, options);
}

}  // namespace dflash::nn

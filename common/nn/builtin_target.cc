#include "common/nn/builtin_target.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/Utils.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/rng.h"
#include "common/config/builtins.h"
#include "common/model/builtin_config.h"

namespace dflash::nn {

using config::TinyQwen3;

std::map<std::string, at::Tensor> RandomQwen3Weights(
    const model::TransformerConfig& c, int64_t num_layers,
    const std::function<at::Tensor(at::IntArrayRef)>& normal, const at::TensorOptions& ones_options,
    double lm_head_divisor) {
  auto matrix = [&](int64_t out, int64_t in) {
    return normal({out, in}) / std::sqrt(static_cast<double>(in));
  };
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  std::map<std::string, at::Tensor> w;
  w["model.embed_tokens.weight"] = normal({c.vocab_size, h});
  w["lm_head.weight"] = normal({c.vocab_size, h}) / lm_head_divisor;
  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    w[p + "input_layernorm.weight"] = at::ones({h}, ones_options);
    w[p + "post_attention_layernorm.weight"] = at::ones({h}, ones_options);
    w[p + "self_attn.q_norm.weight"] = at::ones({d}, ones_options);
    w[p + "self_attn.k_norm.weight"] = at::ones({d}, ones_options);
    w[p + "self_attn.q_proj.weight"] = matrix(q, h);
    w[p + "self_attn.k_proj.weight"] = matrix(kv, h);
    w[p + "self_attn.v_proj.weight"] = matrix(kv, h);
    w[p + "self_attn.o_proj.weight"] = matrix(h, q);
    w[p + "mlp.gate_proj.weight"] = matrix(inter, h);
    w[p + "mlp.up_proj.weight"] = matrix(inter, h);
    w[p + "mlp.down_proj.weight"] = matrix(h, inter);
  }
  w["model.norm.weight"] = at::ones({h}, ones_options);
  return w;
}

std::map<std::string, at::Tensor> RandomHybridWeights(const model::TransformerConfig& c,
                                                      int64_t num_layers,
                                                      const at::TensorOptions& opt) {
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  const int64_t hv = c.linear_num_value_heads, vd = hv * c.linear_value_head_dim;
  const int64_t cd = 2 * c.linear_num_key_heads * c.linear_key_head_dim + vd;
  const int64_t kernel = c.linear_conv_kernel_dim;
  auto matrix = [&](std::vector<int64_t> shape) {
    const double in = static_cast<double>(shape.back());
    return at::randn(shape, opt).div_(std::sqrt(in));
  };
  std::map<std::string, at::Tensor> w;
  w["model.embed_tokens.weight"] = at::randn({c.vocab_size, h}, opt);
  w["lm_head.weight"] = matrix({c.vocab_size, h});
  w["model.norm.weight"] = at::zeros({h}, opt);
  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    w[p + "input_layernorm.weight"] = at::zeros({h}, opt);
    w[p + "post_attention_layernorm.weight"] = at::zeros({h}, opt);
    if (model::IsLinearAttentionLayer(c, i)) {
      const std::string l = p + "linear_attn.";
      w[l + "in_proj_qkv.weight"] = matrix({cd, h});
      w[l + "in_proj_z.weight"] = matrix({vd, h});
      w[l + "in_proj_b.weight"] = matrix({hv, h});
      w[l + "in_proj_a.weight"] = matrix({hv, h});
      w[l + "conv1d.weight"] = matrix({cd, 1, kernel}).mul_(std::sqrt(1.0 / kernel));
      w[l + "dt_bias"] = at::ones({hv}, opt);
      w[l + "A_log"] = (at::rand({hv}, opt) * 4.0 - 3.0);
      w[l + "norm.weight"] = at::ones({c.linear_value_head_dim}, opt);
      w[l + "out_proj.weight"] = matrix({h, vd});
    } else {
      w[p + "self_attn.q_norm.weight"] = at::zeros({d}, opt);
      w[p + "self_attn.k_norm.weight"] = at::zeros({d}, opt);
      w[p + "self_attn.q_proj.weight"] = matrix({2 * q, h});
      w[p + "self_attn.k_proj.weight"] = matrix({kv, h});
      w[p + "self_attn.v_proj.weight"] = matrix({kv, h});
      w[p + "self_attn.o_proj.weight"] = matrix({h, q});
    }
    w[p + "mlp.gate_proj.weight"] = matrix({inter, h});
    w[p + "mlp.up_proj.weight"] = matrix({inter, h});
    w[p + "mlp.down_proj.weight"] = matrix({h, inter});
  }
  return w;
}

namespace {

// builtin:tiny-qwen3 answers the way a model trained on builtin:tiny-chat would, so that its own
// generations (dflashctl regen, speculative decoding) have structure a drafter can learn, as a
// real model's do: its layers write to the residual stream at a tenth of their random scale (the
// last hidden state stays near the current token's embedding, moved by the context), and the
// lm_head row of answer token v is the unit embedding of the token that tiny-chat's successor
// table puts before v (every other row is zero). Greedy decoding therefore continues an answer
// token with its tiny-chat successor and a prompt token with the answer token whose predecessor's
// embedding it is closest to; the context perturbs the rest.
void ShapeLikeTrainedOnTinyChat(int64_t layers, std::map<std::string, at::Tensor>* w) {
  constexpr double kLayerScale = 0.1;
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    (*w)[p + "self_attn.o_proj.weight"] = (*w)[p + "self_attn.o_proj.weight"] * kLayerScale;
    (*w)[p + "mlp.down_proj.weight"] = (*w)[p + "mlp.down_proj.weight"] * kLayerScale;
  }
  const at::Tensor& embed = (*w)["model.embed_tokens.weight"];
  at::Tensor lm_head = at::zeros_like((*w)["lm_head.weight"]);
  SplitMix64 rng(TinyQwen3::kTinyChatSeed);
  const std::vector<int32_t> succ = config::TinyChatSuccessors(rng);
  for (int64_t i = 0; i < TinyQwen3::kAnswerTokens; ++i) {
    at::Tensor pred = embed[TinyQwen3::kFirstDataToken + i];
    lm_head[succ[i]].copy_(pred / pred.norm());
  }
  (*w)["lm_head.weight"] = lm_head;
}

}  // namespace

absl::StatusOr<model::TransformerConfig> BuiltinTargetConfig(const std::string& name) {
  return model::BuiltinTargetConfig(name);
}

absl::StatusOr<std::unique_ptr<TargetModel>> BuiltinTarget(const std::string& name,
                                                           const TargetModelOptions& options) {
  absl::StatusOr<model::TransformerConfig> config = BuiltinTargetConfig(name);
  if (!config.ok()) return config.status();
  const model::TransformerConfig& t = *config;
  // The tiny target's weights come from a seeded CPU generator. The 8B shape is drawn on the
  // target's device in its dtype (32 GB of fp32 on the host would take minutes), from the device's
  // default generator seeded here: the target and drafter workers draw embed_tokens and lm_head
  // first, in the same order, so they agree on the same GPU model.
  const bool large = name != "tiny-qwen3";
  at::Generator gen = at::detail::createCPUGenerator(TinyQwen3::kWeightSeed);
  if (large) at::manual_seed(TinyQwen3::kWeightSeed);
  const at::TensorOptions opts =
      large ? at::TensorOptions().dtype(options.dtype).device(options.device)
            : at::TensorOptions().dtype(at::kFloat);
  auto normal = [&](at::IntArrayRef shape) {
    return large ? at::randn(shape, opts) : at::randn(shape, gen, opts);
  };
  // Layers past the largest feature layer are never run (target_model.h): not drawn either.
  int64_t layers = t.num_hidden_layers;
  if (!options.layer_ids.empty() && !options.full) {
    layers = 1 + *std::max_element(options.layer_ids.begin(), options.layer_ids.end());
  }
  if (model::IsHybrid(t)) {  // qwen3.5-27b-random
    return TargetModel::FromTensors(t, RandomHybridWeights(t, layers, opts), options);
  }
  // The large shape: sharp logits, as a trained model's lm_head gives (with a normed hidden state
  // of RMS 1 each logit has a standard deviation of 4). tiny-qwen3's lm_head is replaced below.
  std::map<std::string, at::Tensor> w =
      RandomQwen3Weights(t, layers, normal, opts, /*lm_head_divisor=*/2.0);
  if (!large) ShapeLikeTrainedOnTinyChat(layers, &w);
  // Taken, not copied: each layer's drawn q/k/v and gate/up go once fused.
  return TargetModel::FromTensors(t, std::move(w), options);
}

}  // namespace dflash::nn

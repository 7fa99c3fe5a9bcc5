#include "common/nn/target_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/nn/attention.h"
#include "common/nn/tensor_parallel.h"
#include "common/nn/torch_status.h"
#include "common/nn/weights.h"

namespace dflash::nn {
namespace {

// The tensors of one decoder layer as the checkpoint stores them, before fusing.
struct RawLayer {
  at::Tensor input_norm, q, k, v, q_bias, k_bias, v_bias, o, o_bias, q_norm, k_norm;
  at::Tensor post_norm, gate, up, down, gate_bias, up_bias, down_bias;
  at::Tensor router;                                            // a sparse (MoE) layer's
  std::vector<at::Tensor> expert_gate, expert_up, expert_down;  // per expert, in order
  at::Tensor experts_gate_up, experts_down;  // or already stacked (transformers 5's layout)
  at::Tensor shared_gate, shared_up, shared_down, shared_expert_gate;  // a shared expert
  // A linear-attention layer's: Qwen3.5's four input projections or Qwen3-Next's two fused ones.
  at::Tensor in_qkv, in_z, in_b, in_a, in_qkvz, in_ba;
  at::Tensor conv, dt_bias, a_log, linear_norm, out_proj;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  at::Tensor RawLayer::*field = nullptr;  // where a layer tensor goes; null for top-level tensors
  std::vector<at::Tensor> RawLayer::*list = nullptr;  // or the per-expert list it is appended to
};

// HF names and shapes of decoder layer `i` for this config. A sparse layer's experts are stored
// one module per expert (mlp.experts.{e}.gate_proj.weight, ...; the published Qwen3-MoE
// checkpoints) or, with `stacked_experts`, as two tensors (mlp.experts.gate_up_proj [E, 2I, H] and
// mlp.experts.down_proj [E, H, I]; transformers 5).
// A gated delta-rule layer's tensors (linear_attn.*).
void AddLinearAttentionSpecs(const model::TransformerConfig& c, const std::string& layer,
                             std::vector<TensorSpec>* s) {
  const GatedDeltaDims d = GatedDeltaDims::Of(c);
  const int64_t h = c.hidden_size, hv = d.num_v_heads, vd = d.value_dim(), cd = d.conv_dim();
  const std::string p = layer + "linear_attn.";
  if (c.fused_linear_projections) {
    s->push_back({p + "in_proj_qkvz.weight", {cd + vd, h}, &RawLayer::in_qkvz});
    s->push_back({p + "in_proj_ba.weight", {2 * hv, h}, &RawLayer::in_ba});
  } else {
    s->push_back({p + "in_proj_qkv.weight", {cd, h}, &RawLayer::in_qkv});
    s->push_back({p + "in_proj_z.weight", {vd, h}, &RawLayer::in_z});
    s->push_back({p + "in_proj_b.weight", {hv, h}, &RawLayer::in_b});
    s->push_back({p + "in_proj_a.weight", {hv, h}, &RawLayer::in_a});
  }
  s->push_back({p + "conv1d.weight", {cd, 1, d.conv_kernel}, &RawLayer::conv});
  s->push_back({p + "dt_bias", {hv}, &RawLayer::dt_bias});
  s->push_back({p + "A_log", {hv}, &RawLayer::a_log});
  s->push_back({p + "norm.weight", {d.v_head_dim}, &RawLayer::linear_norm});
  s->push_back({p + "out_proj.weight", {h, vd}, &RawLayer::out_proj});
}

std::vector<TensorSpec> LayerSpecs(const model::TransformerConfig& c, int64_t i,
                                   bool stacked_experts) {
  const std::string p = absl::StrCat(c.weight_prefix, "layers.", i, ".");
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  const bool linear = model::IsLinearAttentionLayer(c, i);
  const int64_t q_rows = c.attn_output_gate ? 2 * q : q;  // [query; gate] per head
  std::vector<TensorSpec> s = {
      {p + "input_layernorm.weight", {h}, &RawLayer::input_norm},
      {p + "post_attention_layernorm.weight", {h}, &RawLayer::post_norm},
  };
  if (linear) {
    AddLinearAttentionSpecs(c, p, &s);
  } else {
    s.push_back({p + "self_attn.q_proj.weight", {q_rows, h}, &RawLayer::q});
    s.push_back({p + "self_attn.k_proj.weight", {kv, h}, &RawLayer::k});
    s.push_back({p + "self_attn.v_proj.weight", {kv, h}, &RawLayer::v});
    s.push_back({p + "self_attn.o_proj.weight", {h, q}, &RawLayer::o});
  }
  if (model::IsMoeLayer(c, i) && c.shared_expert_intermediate_size > 0) {
    const int64_t si = c.shared_expert_intermediate_size;
    s.push_back({p + "mlp.shared_expert.gate_proj.weight", {si, h}, &RawLayer::shared_gate});
    s.push_back({p + "mlp.shared_expert.up_proj.weight", {si, h}, &RawLayer::shared_up});
    s.push_back({p + "mlp.shared_expert.down_proj.weight", {h, si}, &RawLayer::shared_down});
    s.push_back({p + "mlp.shared_expert_gate.weight", {1, h}, &RawLayer::shared_expert_gate});
  }
  if (model::IsMoeLayer(c, i)) {
    const int64_t mi = c.moe_intermediate_size;
    s.push_back({p + "mlp.gate.weight", {c.num_experts, h}, &RawLayer::router});
    if (stacked_experts) {
      s.push_back(
          {p + "mlp.experts.gate_up_proj", {c.num_experts, 2 * mi, h}, &RawLayer::experts_gate_up});
      s.push_back({p + "mlp.experts.down_proj", {c.num_experts, h, mi}, &RawLayer::experts_down});
    }
    for (int64_t e = 0; e < (stacked_experts ? 0 : c.num_experts); ++e) {
      const std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
      s.push_back({x + "gate_proj.weight", {mi, h}, nullptr, &RawLayer::expert_gate});
      s.push_back({x + "up_proj.weight", {mi, h}, nullptr, &RawLayer::expert_up});
      s.push_back({x + "down_proj.weight", {h, mi}, nullptr, &RawLayer::expert_down});
    }
  } else {
    s.push_back({p + "mlp.gate_proj.weight", {inter, h}, &RawLayer::gate});
    s.push_back({p + "mlp.up_proj.weight", {inter, h}, &RawLayer::up});
    s.push_back({p + "mlp.down_proj.weight", {h, inter}, &RawLayer::down});
  }
  if (c.attention_bias && !linear) {
    s.push_back({p + "self_attn.q_proj.bias", {q_rows}, &RawLayer::q_bias});
    s.push_back({p + "self_attn.k_proj.bias", {kv}, &RawLayer::k_bias});
    s.push_back({p + "self_attn.v_proj.bias", {kv}, &RawLayer::v_bias});
    s.push_back({p + "self_attn.o_proj.bias", {h}, &RawLayer::o_bias});
  }
  if (c.qk_norm && !linear) {
    s.push_back({p + "self_attn.q_norm.weight", {d}, &RawLayer::q_norm});
    s.push_back({p + "self_attn.k_norm.weight", {d}, &RawLayer::k_norm});
  }
  if (c.mlp_bias && !model::IsMoeLayer(c, i)) {
    s.push_back({p + "mlp.gate_proj.bias", {inter}, &RawLayer::gate_bias});
    s.push_back({p + "mlp.up_proj.bias", {inter}, &RawLayer::up_bias});
    s.push_back({p + "mlp.down_proj.bias", {h}, &RawLayer::down_bias});
  }
  return s;
}

std::vector<TensorSpec> TopLevelSpecs(const model::TransformerConfig& c) {
  std::vector<TensorSpec> s = {
      {c.weight_prefix + "embed_tokens.weight", {c.vocab_size, c.hidden_size}},
      {c.weight_prefix + "norm.weight", {c.hidden_size}}};
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return s;
}

// Whether the checkpoint stores a sparse layer's experts stacked (transformers 5): decided by the
// first sparse layer (a stacked tensor of the wrong shape is then reported by its check).
bool StackedExperts(const model::TransformerConfig& c, const WeightSource& source) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!model::IsMoeLayer(c, i)) continue;
    const std::string name =
        absl::StrCat(c.weight_prefix, "layers.", i, ".mlp.experts.gate_up_proj");
    return source.Check(name, {}).code() != absl::StatusCode::kNotFound;
  }
  return false;
}

// Every tensor of the full model, so that a damaged checkpoint is refused whole at load time.
absl::Status CheckAllTensors(const model::TransformerConfig& c, const WeightReader& reader) {
  const bool stacked = StackedExperts(c, reader);
  for (const TensorSpec& spec : TopLevelSpecs(c))
    RETURN_IF_ERROR(reader.Check(spec.name, spec.shape));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    for (const TensorSpec& spec : LayerSpecs(c, i, stacked)) {
      RETURN_IF_ERROR(reader.Check(spec.name, spec.shape));
    }
  }
  return absl::OkStatus();
}

// cat of the defined tensors among `parts` (all defined or none: biases follow one config flag).
at::Tensor CatRows(std::vector<at::Tensor> parts) {
  if (!parts.front().defined()) return {};
  return at::cat(parts, 0);
}

// A zero-centered norm weight as the scale it stands for: 1 + weight, in fp32 (HF computes
// output * (1.0 + weight.float()) before casting).
at::Tensor NormWeight(const at::Tensor& w, const model::TransformerConfig& c) {
  if (!w.defined() || !c.zero_centered_norm) return w;
  return w.to(at::kFloat) + 1.0;
}

// The input projections of a linear-attention layer as one [q; k; v; z; b; a] matrix. Qwen3-Next
// stores in_proj_qkvz grouped per key head ([q_i; k_i; v_i; z_i] with the r = Hv/Hk value heads
// of key head i in v_i and z_i) and in_proj_ba as [b_i; a_i] per key head: regrouped here.
at::Tensor LinearInProj(const RawLayer& raw, const GatedDeltaDims& d) {
  if (!raw.in_qkvz.defined()) return at::cat({raw.in_qkv, raw.in_z, raw.in_b, raw.in_a}, 0);
  const int64_t hk = d.num_k_heads, r = d.num_v_heads / d.num_k_heads, h = raw.in_qkvz.size(1);
  const int64_t dk = d.k_head_dim, rv = r * d.v_head_dim;
  at::Tensor g = raw.in_qkvz.view({hk, 2 * dk + 2 * rv, h});
  at::Tensor ba = raw.in_ba.view({hk, 2 * r, h});
  auto part = [h](const at::Tensor& t, int64_t begin, int64_t n) {
    return t.narrow(1, begin, n).reshape({-1, h});
  };
  return at::cat({part(g, 0, dk), part(g, dk, dk), part(g, 2 * dk, rv), part(g, 2 * dk + rv, rv),
                  part(ba, 0, r), part(ba, r, r)},
                 0);
}

TargetLayerWeights Fuse(RawLayer raw, const model::TransformerConfig& c) {
  TargetLayerWeights w;
  w.input_norm = NormWeight(raw.input_norm, c);
  w.post_norm = NormWeight(raw.post_norm, c);
  if (raw.conv.defined()) {
    w.linear.in_proj = LinearInProj(raw, GatedDeltaDims::Of(c));
    w.linear.conv = raw.conv.squeeze(1);
    w.linear.dt_bias = std::move(raw.dt_bias);
    w.linear.a_log = std::move(raw.a_log);
    w.linear.norm = std::move(raw.linear_norm);
    w.linear.out_proj = std::move(raw.out_proj);
  } else {
    w.qkv = CatRows({raw.q, raw.k, raw.v});
    w.qkv_bias = CatRows({raw.q_bias, raw.k_bias, raw.v_bias});
    w.q_norm = NormWeight(raw.q_norm, c);
    w.k_norm = NormWeight(raw.k_norm, c);
    w.o_proj = std::move(raw.o);
    w.o_bias = std::move(raw.o_bias);
  }
  w.gate_up = CatRows({raw.gate, raw.up});
  w.gate_up_bias = CatRows({raw.gate_bias, raw.up_bias});
  w.down = std::move(raw.down);
  w.down_bias = std::move(raw.down_bias);
  if (raw.router.defined()) {
    w.moe.router = std::move(raw.router);
    if (raw.experts_gate_up.defined()) {
      w.moe.gate_up = std::move(raw.experts_gate_up);
      w.moe.down = std::move(raw.experts_down);
    } else {
      w.moe.gate_up = at::cat({at::stack(raw.expert_gate), at::stack(raw.expert_up)}, 1);
      w.moe.down = at::stack(raw.expert_down);
    }
    if (raw.shared_gate.defined()) {
      w.moe.shared_gate_up = at::cat({raw.shared_gate, raw.shared_up}, 0);
      w.moe.shared_down = std::move(raw.shared_down);
      w.moe.shared_gate = std::move(raw.shared_expert_gate);
    }
    w.moe.top_k = c.num_experts_per_tok;
    w.moe.norm_topk_prob = c.norm_topk_prob;
  }
  return w;
}

absl::Status ValidateConfig(const model::TransformerConfig& c) {
  const std::vector<std::string>& types = model::TargetModelTypes();
  if (std::find(types.begin(), types.end(), c.model_type) == types.end()) {
    return absl::UnimplementedError(absl::StrCat("model_type \"", c.model_type,
                                                 "\": the target model supports ",
                                                 absl::StrJoin(types, ", ")));
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", c.head_dim, " must be even"));
  }
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", c.num_attention_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   c.num_key_value_heads));
  }
  if (c.rope_scaling.has_value() && c.rope_scaling->rope_type != "llama3") {
    return absl::UnimplementedError(
        absl::StrCat("rope_scaling type \"", c.rope_scaling->rope_type, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ResolveLayerIds(const model::TransformerConfig& c,
                                                     const TargetModelOptions& options) {
  std::vector<int64_t> ids = options.layer_ids;
  if (ids.empty()) {
    if (options.num_features < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_features ", options.num_features, " must be at least 1"));
    }
    ids = model::DefaultTargetLayerIds(c.num_hidden_layers, options.num_features);
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("target layer id ", id, " is outside [0, ", c.num_hidden_layers, ")"));
    }
  }
  return ids;
}

std::string ScalarName(c10::ScalarType t) { return c10::toString(t); }

}  // namespace

TargetModel::TargetModel(model::TransformerConfig config, std::vector<int64_t> layer_ids,
                         const TargetModelOptions& options)
    : config_(std::move(config)),
      layer_ids_(std::move(layer_ids)),
      dtype_(options.dtype),
      device_(options.device),
      full_(options.full),
      tp_rank_(options.tp_rank),
      tp_world_(options.tp_world),
      tp_all_reduce_(options.tp_all_reduce) {
  const int64_t last = *std::max_element(layer_ids_.begin(), layer_ids_.end());
  slots_of_layer_.resize(last + 1);
  for (size_t slot = 0; slot < layer_ids_.size(); ++slot) {
    slots_of_layer_[layer_ids_[slot]].push_back(static_cast<int64_t>(slot));
  }
}

std::unique_ptr<TargetModel> TargetModel::WithAllReduce(
    std::function<absl::Status(const at::Tensor&)> all_reduce) const {
  std::unique_ptr<TargetModel> m(new TargetModel(*this));  // the tensors' storage is shared
  m->tp_all_reduce_ = std::move(all_reduce);
  return m;
}

absl::StatusOr<std::unique_ptr<TargetModel>> TargetModel::Create(
    model::TransformerConfig config, const TargetModelOptions& options) {
  RETURN_IF_ERROR(ValidateConfig(config));
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, ResolveLayerIds(config, options));
  if (!c10::isFloatingType(options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target model dtype ", ScalarName(options.dtype), " is not floating-point"));
  }
  if (options.tp_world != 1 || options.tp_rank != 0) {
    if (options.tp_rank < 0 || options.tp_rank >= options.tp_world) {
      return absl::InvalidArgumentError(absl::StrCat("tensor-parallel rank ", options.tp_rank,
                                                     " is outside [0, ", options.tp_world, ")"));
    }
    if (!options.tp_all_reduce) {
      return absl::InvalidArgumentError("a tensor-parallel target needs an all-reduce");
    }
    const int64_t layers =
        options.full ? config.num_hidden_layers : *std::max_element(ids.begin(), ids.end()) + 1;
    RETURN_IF_ERROR(model::CheckTensorParallel(config, layers, options.tp_world));
  }
  return std::unique_ptr<TargetModel>(new TargetModel(std::move(config), std::move(ids), options));
}

absl::StatusOr<std::unique_ptr<TargetModel>> TargetModel::Load(const std::string& dir,
                                                               const TargetModelOptions& options) {
  try {
    ASSIGN_OR_RETURN(model::TransformerConfig config, model::LoadHfConfig(dir));
    RETURN_IF_ERROR(Annotate(ValidateConfig(config), absl::StrCat(dir, "/config.json")));
    ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> checkpoint, model::Checkpoint::Open(dir));
    WeightReader reader(*checkpoint, options.dtype, options.device);
    RETURN_IF_ERROR(CheckAllTensors(config, reader));
    ASSIGN_OR_RETURN(std::unique_ptr<TargetModel> m, Create(std::move(config), options));
    RETURN_IF_ERROR(m->LoadWeights(reader));
    m->source_ = dir;
    return m;
  } catch (const c10::Error& e) {
    return TorchStatus(e, absl::StrCat("loading the target model from ", dir));
  }
}

absl::StatusOr<std::unique_ptr<TargetModel>> TargetModel::FromTensors(
    const model::TransformerConfig& config, const std::map<std::string, at::Tensor>& tensors,
    const TargetModelOptions& options) {
  try {
    ASSIGN_OR_RETURN(std::unique_ptr<TargetModel> m, Create(config, options));
    RETURN_IF_ERROR(m->LoadWeights(TensorMapReader(tensors, options.dtype, options.device)));
    return m;
  } catch (const c10::Error& e) {
    return TorchStatus(e, "building the target model");
  }
}

absl::StatusOr<std::unique_ptr<TargetModel>> TargetModel::FromTensors(
    const model::TransformerConfig& config, std::map<std::string, at::Tensor>&& tensors,
    const TargetModelOptions& options) {
  try {
    ASSIGN_OR_RETURN(std::unique_ptr<TargetModel> m, Create(config, options));
    RETURN_IF_ERROR(
        m->LoadWeights(TensorMapReader(std::move(tensors), options.dtype, options.device)));
    return m;
  } catch (const c10::Error& e) {
    return TorchStatus(e, "building the target model");
  }
}

absl::Status TargetModel::LoadWeights(const WeightSource& source) {
  // Plain tensors, not inference tensors: the drafter's autograd graph uses embed and lm_head.
  at::NoGradGuard no_grad;
  const std::vector<int64_t> vh = {config_.vocab_size, config_.hidden_size};
  ASSIGN_OR_RETURN(embed_tokens_, source.Read(config_.weight_prefix + "embed_tokens.weight", vh));
  if (config_.tie_word_embeddings) {
    lm_head_ = embed_tokens_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, source.Read("lm_head.weight", vh));
  }
  inv_freq_ = RopeInvFreq(config_, model::RotaryDim(config_)).to(device_);
  layers_.clear();
  const size_t num_layers =
      full_ ? static_cast<size_t>(config_.num_hidden_layers) : slots_of_layer_.size();
  if (full_) {
    ASSIGN_OR_RETURN(at::Tensor norm,
                     source.Read(config_.weight_prefix + "norm.weight", {config_.hidden_size}));
    final_norm_ = NormWeight(norm, config_);  // 1 + weight when zero-centered, as the layers' norms
  }
  const bool stacked = StackedExperts(config_, source);
  for (size_t i = 0; i < num_layers; ++i) {
    RawLayer raw;
    for (const TensorSpec& spec : LayerSpecs(config_, static_cast<int64_t>(i), stacked)) {
      ASSIGN_OR_RETURN(at::Tensor t, source.Read(spec.name, spec.shape));
      if (spec.field != nullptr) {
        raw.*spec.field = std::move(t);
      } else {
        (raw.*spec.list).push_back(std::move(t));
      }
    }
    layers_.push_back(Fuse(std::move(raw), config_));
    ShardLayer(layers_.back(), config_, tp_rank_, tp_world_);
  }
  return absl::OkStatus();
}

absl::StatusOr<VarlenDocs> TargetModel::CheckInputs(const at::Tensor& input_ids,
                                                    const at::Tensor& positions,
                                                    const at::Tensor& cu_seqlens,
                                                    const at::Tensor& features) const {
  if (input_ids.dim() != 1 || input_ids.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError("input_ids must be a 1-D int64 tensor");
  }
  const int64_t t = input_ids.size(0);
  if (positions.dim() != 1 || positions.scalar_type() != at::kLong || positions.size(0) != t) {
    return absl::InvalidArgumentError(absl::StrCat("positions must be a 1-D int64 tensor of ", t));
  }
  if (cu_seqlens.dim() != 1 || cu_seqlens.scalar_type() != at::kInt || cu_seqlens.size(0) < 1) {
    return absl::InvalidArgumentError("cu_seqlens must be a non-empty 1-D int32 tensor");
  }
  if (features.dim() != 2 || features.size(0) != t || features.size(1) != feature_dim() ||
      features.scalar_type() != dtype_ || features.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("features must be [", t, ", ", feature_dim(), "] ", ScalarName(dtype_), " on ",
                     device_.str(), "; got ", ShapeString(features.sizes().vec()), " ",
                     ScalarName(features.scalar_type()), " on ", features.device().str()));
  }
  if (t > 0) {
    const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids span [", lo, ", ", hi,
                                                     "], outside the vocabulary [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  at::Tensor host = cu_seqlens.to(at::kCPU).contiguous();
  const int32_t* cu = host.data_ptr<int32_t>();
  const int64_t n = host.numel();
  if (cu[0] != 0 || cu[n - 1] != t) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_seqlens runs from ", cu[0], " to ", cu[n - 1], ", expected 0 to ", t));
  }
  for (int64_t i = 1; i < n; ++i) {
    if (cu[i] < cu[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("cu_seqlens decreases at index ", i));
    }
  }
  return VarlenDocs::FromCuSeqlens(host, device_);
}

absl::Status TargetModel::Forward(const at::Tensor& input_ids, const at::Tensor& positions,
                                  const at::Tensor& cu_seqlens, const at::Tensor& features) const {
  try {
    ASSIGN_OR_RETURN(VarlenDocs docs, CheckInputs(input_ids, positions, cu_seqlens, features));
    RunLayers(input_ids, positions, docs, features);
    return absl::OkStatus();
  } catch (const TensorParallelError& e) {
    return e.status;
  } catch (const c10::Error& e) {
    // RESOURCE_EXHAUSTED: the target worker recovers by running the batch's documents in halves.
    return TorchStatus(e, "target model forward");
  }
}

absl::StatusOr<at::Tensor> TargetModel::Forward(const at::Tensor& input_ids,
                                                const at::Tensor& positions,
                                                const at::Tensor& cu_seqlens) const {
  at::Tensor features;
  try {
    // Allocated outside InferenceMode: the caller may feed it to an autograd graph (the drafter).
    const int64_t t = input_ids.dim() == 1 ? input_ids.size(0) : 0;
    features = at::empty({t, feature_dim()}, at::TensorOptions().dtype(dtype_).device(device_));
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating target features: ", e.what_without_backtrace()));
  }
  RETURN_IF_ERROR(Forward(input_ids, positions, cu_seqlens, features));
  return features;
}

void TargetModel::RunLayers(const at::Tensor& input_ids, const at::Tensor& positions,
                            const VarlenDocs& docs, const at::Tensor& features) const {
  c10::InferenceMode inference;
  const int64_t h = config_.hidden_size;
  RopeTables rope = MakeRopeTables(positions.to(device_), inv_freq_, dtype_);  // [T, D] each
  at::Tensor x = at::embedding(embed_tokens_, input_ids.to(device_));          // [T, H]
  for (size_t i = 0; i < slots_of_layer_.size(); ++i) {  // up to the last feature layer
    x = RunLayer(layers_[i], x, rope, docs);
    // Each captured layer lands in its column block of the [T, K*H] buffer: no final cat.
    for (int64_t slot : slots_of_layer_[i]) features.narrow(1, slot * h, h).copy_(x);
  }
}

double TargetModel::AttentionScale() const {
  return std::pow(static_cast<double>(config_.head_dim), -0.5);
}

at::Tensor TargetModel::Norm(const at::Tensor& x, const at::Tensor& weight) const {
  if (config_.zero_centered_norm) return RmsNormFp32Scale(x, weight, config_.rms_norm_eps);
  return RmsNorm(x, weight, config_.rms_norm_eps);
}

TargetModel::Qkv TargetModel::Project(const TargetLayerWeights& w, const at::Tensor& x,
                                      const RopeTables& rope) const {
  const int64_t t = x.size(0), d = config_.head_dim;
  const int64_t hq = config_.num_attention_heads / tp_world_;  // this shard's heads
  const int64_t hkv = config_.num_key_value_heads / tp_world_;
  at::Tensor h = Norm(x, w.input_norm);
  at::Tensor qkv = Linear(h, w.qkv, w.qkv_bias);  // [T, (Hq + 2*Hkv) * D], or (2Hq + 2Hkv) * D
  Qkv out;
  const int64_t qr = config_.attn_output_gate ? 2 * hq * d : hq * d;  // q_proj's rows
  if (config_.attn_output_gate) {                                     // per head [query; gate]
    at::Tensor qg = qkv.narrow(1, 0, qr).view({t, hq, 2 * d});
    out.q = qg.narrow(2, 0, d);
    out.gate = qg.narrow(2, d, d).reshape({t, hq * d});
  } else {
    out.q = qkv.narrow(1, 0, qr).reshape({t, hq, d});
  }
  out.k = qkv.narrow(1, qr, hkv * d).reshape({t, hkv, d});
  out.v = qkv.narrow(1, qr + hkv * d, hkv * d).reshape({t, hkv, d});
  if (w.q_norm.defined() && !config_.zero_centered_norm) {
    // Qwen3: per-head RMSNorm over D, then RoPE; on CUDA one pass each for q and k that reads
    // them where they lie in the qkv product (NormRope).
    out.q = NormRope(out.q, w.q_norm, config_.rms_norm_eps, rope);
    out.k = NormRope(out.k, w.k_norm, config_.rms_norm_eps, rope);
    return out;
  }
  if (w.q_norm.defined()) {  // zero-centered (1 + weight) norms, before RoPE
    out.q = Norm(out.q, w.q_norm);
    out.k = Norm(out.k, w.k_norm);
  }
  out.q = ApplyRope(out.q, rope);
  out.k = ApplyRope(out.k, rope);
  return out;
}

at::Tensor TargetModel::Finish(const TargetLayerWeights& w, const at::Tensor& x,
                               const at::Tensor& attn) const {
  const int64_t t = x.size(0);
  const at::Tensor out = Linear(attn.reshape({t, -1}), w.o_proj, w.o_bias);  // [T, H]
  AllReduce(out);
  return Mlp(w, x + out);
}

void TargetModel::AllReduce(const at::Tensor& partial) const {
  if (tp_world_ == 1) return;
  TORCH_CHECK(partial.is_contiguous(), "tensor-parallel all-reduce of a non-contiguous tensor");
  absl::Status s = tp_all_reduce_(partial);
  if (!s.ok()) throw TensorParallelError{std::move(s)};
}

at::Tensor TargetModel::Mlp(const TargetLayerWeights& w, const at::Tensor& y) const {
  at::Tensor h = Norm(y, w.post_norm);
  if (w.moe.defined()) {
    const at::Tensor out = MoeMlp(h, w.moe).contiguous();
    AllReduce(out);
    return y + out;
  }
  // [T, 2I] with I this shard's intermediate size; silu(gate) * up in one pass on CUDA.
  const at::Tensor act = SwiGluHalves(Linear(h, w.gate_up, w.gate_up_bias));
  const at::Tensor out = Linear(act, w.down, w.down_bias);
  AllReduce(out);
  return y + out;
}

at::Tensor TargetModel::RunLayer(const TargetLayerWeights& w, const at::Tensor& x,
                                 const RopeTables& rope, const VarlenDocs& docs) const {
  if (w.linear.defined()) {
    const at::Tensor h = Norm(x, w.input_norm);
    const GatedDeltaDims dims = ShardDims(GatedDeltaDims::Of(config_), tp_world_);
    const at::Tensor out = GatedDeltaNet(h, w.linear, dims, docs).contiguous();
    AllReduce(out);
    return Mlp(w, x + out);
  }
  Qkv qkv = Project(w, x, rope);
  at::Tensor attn = VarlenCausalAttention(qkv.q, qkv.k, qkv.v, docs, AttentionScale());
  if (qkv.gate.defined()) attn = attn.reshape({x.size(0), -1}) * qkv.gate.sigmoid();
  return Finish(w, x, attn);
}

std::string TargetModel::Kernels() const {
  std::string out = "attention: " + VarlenAttentionKernel(device_, dtype_, config_.head_dim);
  int64_t linear = 0;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    linear += model::IsLinearAttentionLayer(config_, i) ? 1 : 0;
  }
  if (linear > 0) {
#ifdef DFLASH_HAVE_GATED_DELTA_SCAN
    const bool fused = device_.is_cuda();
#else
    const bool fused = false;
#endif
    out += "; linear attention (" + std::to_string(linear) + " layers): gated delta rule, " +
           (fused ? "fused scan kernels" : "reference");
  }
  // Every MLP (dense, experts, shared expert) runs SwiGluHalves.
  out += std::string("; mlp activation: ") + SwiGluHalvesKernel(device_, dtype_);
  if (config_.qk_norm && !config_.zero_centered_norm) {
    out += std::string("; q/k norm and rope: ") + NormRopeKernel(device_, dtype_, config_.head_dim);
  }
  return out;
}

}  // namespace dflash::nn

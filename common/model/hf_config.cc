#include "common/model/hf_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "nlohmann/json.hpp"

namespace dflash::model {
namespace {

using nlohmann::json;

// Upper bounds far above any real model; they keep later size arithmetic (bytes of a layer, of a
// KV cache) far from int64 overflow and turn a corrupted config into a clear error.
constexpr int64_t kMaxHidden = 1 << 17;
constexpr int64_t kMaxIntermediate = 1 << 20;
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxPositions = int64_t{1} << 30;
constexpr int64_t kMaxBlockSize = 1024;

// Reads typed fields of one JSON object and turns every problem into "<source>: <field>: ...".
// A JSON null counts as absent: HF writes "head_dim": null and "rope_scaling": null.
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& At(const char* key) const { return obj_.at(key); }

  absl::Status Error(const char* key, const std::string& msg) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, key, ": ", msg));
  }

  // An integer in [lo, hi]; `*out` keeps its value when absent and !required.
  absl::Status Int(const char* key, bool required, int64_t lo, int64_t hi, int64_t* out) const {
    if (!Has(key)) return required ? Error(key, "required") : absl::OkStatus();
    const json& v = At(key);
    if (!v.is_number_integer())
      return Error(key, absl::StrCat("must be an integer, got ", v.dump()));
    // Integers above INT64_MAX arrive as unsigned; they are out of every range here.
    const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX};
    const int64_t x = huge ? INT64_MAX : v.get<int64_t>();
    if (huge || x < lo || x > hi) {
      return Error(key, absl::StrCat(hi == INT64_MAX ? absl::StrCat("must be at least ", lo)
                                                     : absl::StrCat("must be in ", lo, "..", hi),
                                     ", got ", v.dump()));
    }
    *out = x;
    return absl::OkStatus();
  }

  // A finite number > 0 (integers accepted: "rope_theta": 1000000).
  absl::Status Positive(const char* key, bool required, double* out) const {
    if (!Has(key)) return required ? Error(key, "required") : absl::OkStatus();
    const json& v = At(key);
    if (!v.is_number()) return Error(key, absl::StrCat("must be a number, got ", v.dump()));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x <= 0) {
      return Error(key, absl::StrCat("must be a positive number, got ", v.dump()));
    }
    *out = x;
    return absl::OkStatus();
  }

  absl::Status Bool(const char* key, bool* out) const {
    if (!Has(key)) return absl::OkStatus();
    const json& v = At(key);
    if (!v.is_boolean()) return Error(key, absl::StrCat("must be true or false, got ", v.dump()));
    *out = v.get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const char* key, bool required, std::string* out) const {
    if (!Has(key)) return required ? Error(key, "required") : absl::OkStatus();
    const json& v = At(key);
    if (!v.is_string()) return Error(key, absl::StrCat("must be a string, got ", v.dump()));
    *out = v.get<std::string>();
    return absl::OkStatus();
  }

  absl::Status StringList(const char* key, std::vector<std::string>* out) const {
    if (!Has(key)) return absl::OkStatus();
    const json& v = At(key);
    if (!v.is_array()) return Error(key, absl::StrCat("must be a list of strings, got ", v.dump()));
    out->clear();
    for (const json& e : v) {
      if (!e.is_string()) {
        return Error(key, absl::StrCat("must be a list of strings, got element ", e.dump()));
      }
      out->push_back(e.get<std::string>());
    }
    return absl::OkStatus();
  }

  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

// RoPE settings. transformers < 5 writes "rope_theta" and "rope_scaling" at the top level;
// transformers 5 writes one "rope_parameters" object holding rope_theta, rope_type and the scaling
// fields ({"rope_theta": 10000.0, "rope_type": "default"}). When both forms are present,
// rope_parameters wins.
absl::Status ParseRope(const Fields& f, TransformerConfig* cfg) {
  RETURN_IF_ERROR(f.Positive("rope_theta", false, &cfg->rope_theta));
  const char* key = f.Has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!f.Has(key)) return absl::OkStatus();
  const json& rs = f.At(key);
  if (!rs.is_object()) {
    return f.Error(key, absl::StrCat("must be an object or null, got ", rs.dump()));
  }
  Fields r(rs, f.source(), absl::StrCat(key, "."));
  if (std::string(key) == "rope_parameters") {
    RETURN_IF_ERROR(r.Positive("rope_theta", false, &cfg->rope_theta));
  }
  // transformers writes "rope_type"; older configs say "type".
  const char* type_key = r.Has("rope_type") ? "rope_type" : "type";
  std::string type;
  RETURN_IF_ERROR(r.String(type_key, /*required=*/true, &type));
  if (type == "default") return absl::OkStatus();  // plain RoPE, written out explicitly
  if (type != "llama3") {
    return r.Error(type_key, absl::StrCat("unsupported rope scaling '", type,
                                          "' (supported: llama3, default)"));
  }
  RopeScaling s;
  s.rope_type = type;
  RETURN_IF_ERROR(r.Positive("factor", true, &s.factor));
  RETURN_IF_ERROR(r.Positive("low_freq_factor", true, &s.low_freq_factor));
  RETURN_IF_ERROR(r.Positive("high_freq_factor", true, &s.high_freq_factor));
  RETURN_IF_ERROR(r.Int("original_max_position_embeddings", true, 1, kMaxPositions,
                        &s.original_max_position_embeddings));
  if (s.factor < 1.0) {
    return r.Error("factor", absl::StrCat("must be at least 1, got ", s.factor));
  }
  if (s.high_freq_factor <= s.low_freq_factor) {
    return r.Error("high_freq_factor",
                   absl::StrCat("must be greater than low_freq_factor (", s.low_freq_factor,
                                "), got ", s.high_freq_factor));
  }
  cfg->rope_scaling = s;
  return absl::OkStatus();
}

// A DFlash drafter's per-layer attention (method.md §2.1), as transformers' Qwen3Config reads it
// (the reference package builds its layers from that): layer_types of full_attention and
// sliding_attention, or without it, with use_sliding_window, sliding from max_window_layers (28)
// on; the window is sliding_window (4096) only with use_sliding_window (without it a sliding
// layer is causal inside its block and sees its whole context).
absl::Status ParseDrafterAttention(const Fields& f, TransformerConfig* cfg) {
  if (f.Has("is_causal") && !f.At("is_causal").is_null()) {
    return f.Error("is_causal",
                   "not supported (sliding layers are causal inside the block, full "
                   "layers are not, as the reference package does without it)");
  }
  bool use = false;
  RETURN_IF_ERROR(f.Bool("use_sliding_window", &use));
  std::vector<std::string> types;
  RETURN_IF_ERROR(f.StringList("layer_types", &types));
  if (f.Has("layer_types") && static_cast<int64_t>(types.size()) != cfg->num_hidden_layers) {
    return f.Error("layer_types",
                   absl::StrCat("lists ", types.size(), " layers; num_hidden_layers is ",
                                cfg->num_hidden_layers));
  }
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "full_attention" && types[i] != "sliding_attention") {
      return f.Error("layer_types", absl::StrCat("layer ", i, " is '", types[i],
                                                 "'; a drafter layer is full_attention or "
                                                 "sliding_attention"));
    }
  }
  if (use) {
    int64_t window = 4096;  // Qwen3Config's default
    RETURN_IF_ERROR(f.Int("sliding_window", false, 1, kMaxPositions, &window));
    cfg->sliding_window = window;
    if (!f.Has("layer_types")) {
      int64_t first = 28;  // Qwen3Config's max_window_layers default
      RETURN_IF_ERROR(f.Int("max_window_layers", false, 0, kMaxLayers, &first));
      for (int64_t i = 0; i < cfg->num_hidden_layers; ++i) {
        types.push_back(i >= first ? "sliding_attention" : "full_attention");
      }
    }
  }
  cfg->layer_types = std::move(types);
  return absl::OkStatus();
}

// Attention that dflash does not implement yet is refused rather than silently run as full
// attention (method.md §2: sliding-window target layers are not supported).
absl::Status CheckFullAttention(const Fields& f, bool hybrid) {
  bool sliding = false;
  RETURN_IF_ERROR(f.Bool("use_sliding_window", &sliding));
  if (sliding) return f.Error("use_sliding_window", "sliding-window attention is not supported");
  std::vector<std::string> layer_types;
  RETURN_IF_ERROR(f.StringList("layer_types", &layer_types));
  for (size_t i = 0; i < layer_types.size() && !hybrid; ++i) {  // hybrids: ParseLinearAttention
    if (layer_types[i] != "full_attention") {
      return f.Error("layer_types", absl::StrCat("layer ", i, " is '", layer_types[i],
                                                 "'; only full_attention is supported"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckActivation(const Fields& f) {
  std::string act = "silu";
  RETURN_IF_ERROR(f.String("hidden_act", false, &act));
  if (act != "silu") {
    return f.Error("hidden_act", absl::StrCat("only silu (SwiGLU) is supported, got '", act, "'"));
  }
  return absl::OkStatus();
}

absl::Status ParseAttention(const Fields& f, TransformerConfig* cfg) {
  RETURN_IF_ERROR(f.Int("num_attention_heads", true, 1, kMaxHeads, &cfg->num_attention_heads));
  cfg->num_key_value_heads = cfg->num_attention_heads;
  RETURN_IF_ERROR(f.Int("num_key_value_heads", false, 1, kMaxHeads, &cfg->num_key_value_heads));
  if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
    return f.Error("num_attention_heads",
                   absl::StrCat("must be divisible by num_key_value_heads (",
                                cfg->num_key_value_heads, "), got ", cfg->num_attention_heads));
  }
  if (f.Has("head_dim")) {
    RETURN_IF_ERROR(f.Int("head_dim", true, 1, kMaxHeadDim, &cfg->head_dim));
  } else {
    if (cfg->hidden_size % cfg->num_attention_heads != 0) {
      return f.Error("head_dim", absl::StrCat("absent, and hidden_size (", cfg->hidden_size,
                                              ") is not divisible by num_attention_heads (",
                                              cfg->num_attention_heads, ")"));
    }
    cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
  }
  if (cfg->head_dim % 2 != 0) {  // rotate-half RoPE pairs dimension i with i + head_dim/2
    return f.Error("head_dim", absl::StrCat("must be even, got ", cfg->head_dim));
  }
  RETURN_IF_ERROR(f.Bool("attention_bias", &cfg->attention_bias));
  RETURN_IF_ERROR(f.Bool("mlp_bias", &cfg->mlp_bias));
  return absl::OkStatus();
}

// The output-head scales and DFlash2's settings: in dflash_config, else at the top level (where
// the reference inference package looks, in that order). DFlash2's are required by a
// DFlash2DraftModel.
absl::Status ParseDraftValues(const Fields& f, bool has_dc, bool dflash2, TransformerConfig* cfg) {
  static const json* const kEmpty = new json(json::object());  // Fields keeps a reference
  const Fields d(has_dc ? f.At("dflash_config") : *kEmpty, f.source(), "dflash_config.");
  auto where = [&](const char* key) -> const Fields& { return d.Has(key) ? d : f; };
  RETURN_IF_ERROR(
      where("output_multiplier").Positive("output_multiplier", false, &cfg->output_multiplier));
  RETURN_IF_ERROR(where("input_embedding_scale")
                      .Positive("input_embedding_scale", false, &cfg->input_embedding_scale));
  const Fields& cap = where("final_logit_softcapping");
  if (cap.Has("final_logit_softcapping") &&
      !(cap.At("final_logit_softcapping").is_number() &&
        cap.At("final_logit_softcapping").get<double>() == 0)) {
    RETURN_IF_ERROR(cap.Positive("final_logit_softcapping", false, &cfg->final_logit_softcapping));
  }
  constexpr int64_t kMax = int64_t{1} << 24;
  for (const auto& [key, out] : {std::make_pair("conv_kernel_size", &cfg->conv_kernel_size),
                                 std::make_pair("conv_group_size", &cfg->conv_group_size),
                                 std::make_pair("selector_rank", &cfg->selector_rank),
                                 std::make_pair("selector_top_k", &cfg->selector_top_k)}) {
    if (dflash2) RETURN_IF_ERROR(where(key).Int(key, true, 1, kMax, out));
  }
  return absl::OkStatus();
}

// DFlashDraftModel (and DFlash2DraftModel) fields (method.md §7). A drafter must say its block
// size and target depth.
absl::Status ParseDrafter(const Fields& f, TransformerConfig* cfg) {
  bool drafter = false, dflash2 = false;
  for (const std::string& a : cfg->architectures) {
    drafter |= (a == "DFlashDraftModel" || a == "DFlash2DraftModel");
    dflash2 |= (a == "DFlash2DraftModel");
  }
  RETURN_IF_ERROR(f.Int("num_target_layers", drafter, 1, kMaxLayers, &cfg->num_target_layers));
  const bool has_dc = f.Has("dflash_config");
  if (has_dc && !f.At("dflash_config").is_object()) {
    return f.Error("dflash_config",
                   absl::StrCat("must be an object, got ", f.At("dflash_config").dump()));
  }
  if (drafter) RETURN_IF_ERROR(ParseDraftValues(f, has_dc, dflash2, cfg));
  // The block size is dflash_config.block_size (where the reference inference code looks first)
  // or the top-level block_size (older exports, SGLang); both written by ExportDrafter.
  const bool nested_block = has_dc && f.At("dflash_config").contains("block_size") &&
                            !f.At("dflash_config").at("block_size").is_null();
  RETURN_IF_ERROR(
      f.Int("block_size", drafter && !nested_block, 1, kMaxBlockSize, &cfg->block_size));
  if (!has_dc) return absl::OkStatus();
  const json& dc = f.At("dflash_config");
  Fields d(dc, f.source(), "dflash_config.");
  if (nested_block) {
    const int64_t top = cfg->block_size;
    RETURN_IF_ERROR(d.Int("block_size", true, 1, kMaxBlockSize, &cfg->block_size));
    if (f.Has("block_size") && top != cfg->block_size) {
      return d.Error("block_size",
                     absl::StrCat(cfg->block_size, " differs from the top-level block_size ", top));
    }
  }
  if (d.Has("mask_token_id")) {
    int64_t id = 0;
    RETURN_IF_ERROR(d.Int("mask_token_id", true, 0, cfg->vocab_size - 1, &id));
    cfg->mask_token_id = id;
  }
  if (d.Has("target_layer_ids")) {
    const json& ids = d.At("target_layer_ids");
    if (!ids.is_array() || ids.empty()) {
      return d.Error("target_layer_ids",
                     absl::StrCat("must be a non-empty list of layer ids, got ", ids.dump()));
    }
    const int64_t hi = cfg->num_target_layers > 0 ? cfg->num_target_layers - 1 : kMaxLayers - 1;
    std::vector<int64_t> out;
    std::set<int64_t> seen;
    for (const json& e : ids) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > hi ||
          (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(hi))) {
        return d.Error("target_layer_ids",
                       absl::StrCat("each id must be an integer in 0..", hi,
                                    cfg->num_target_layers > 0 ? " (num_target_layers - 1)" : "",
                                    ", got ", e.dump()));
      }
      if (!seen.insert(e.get<int64_t>()).second) {
        return d.Error("target_layer_ids", absl::StrCat("layer ", e.dump(), " is listed twice"));
      }
      out.push_back(e.get<int64_t>());
    }
    cfg->target_layer_ids = std::move(out);
  }
  return absl::OkStatus();
}

// qwen3_moe: the experts and the router (transformers' Qwen3MoeConfig names and defaults).
absl::Status ParseMoe(const Fields& f, bool shared_expert, TransformerConfig* cfg) {
  constexpr int64_t kMaxExperts = 4096;
  // transformers 5 writes num_local_experts for the same number.
  if (!f.Has("num_experts") && f.Has("num_local_experts")) {
    RETURN_IF_ERROR(f.Int("num_local_experts", true, 1, kMaxExperts, &cfg->num_experts));
  } else if (!f.Has("num_experts")) {
    return f.Error("num_experts", "required (or num_local_experts)");
  } else {
    RETURN_IF_ERROR(f.Int("num_experts", true, 1, kMaxExperts, &cfg->num_experts));
  }
  RETURN_IF_ERROR(
      f.Int("num_experts_per_tok", true, 1, cfg->num_experts, &cfg->num_experts_per_tok));
  RETURN_IF_ERROR(
      f.Int("moe_intermediate_size", true, 1, kMaxIntermediate, &cfg->moe_intermediate_size));
  if (cfg->model_type == "qwen3_5_moe" || cfg->model_type == "qwen3_5_moe_text") {
    // Every layer is sparse and the router always renormalizes its top k (transformers'
    // Qwen3_5MoeTopKRouter); the qwen3_moe keys for other layouts do not apply.
    cfg->norm_topk_prob = true;
    return f.Int("shared_expert_intermediate_size", true, 1, kMaxIntermediate,
                 &cfg->shared_expert_intermediate_size);
  }
  RETURN_IF_ERROR(f.Int("decoder_sparse_step", false, 1, kMaxLayers, &cfg->decoder_sparse_step));
  RETURN_IF_ERROR(f.Bool("norm_topk_prob", &cfg->norm_topk_prob));
  if (f.Has("mlp_only_layers")) {
    const json& v = f.At("mlp_only_layers");
    if (!v.is_array()) {
      return f.Error("mlp_only_layers",
                     absl::StrCat("must be a list of layer ids, got ", v.dump()));
    }
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
          e.get<int64_t>() >= cfg->num_hidden_layers) {
        return f.Error("mlp_only_layers",
                       absl::StrCat("must hold layer ids in 0..", cfg->num_hidden_layers - 1,
                                    ", got ", e.dump()));
      }
      cfg->mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  if (shared_expert) {
    return f.Int("shared_expert_intermediate_size", true, 1, kMaxIntermediate,
                 &cfg->shared_expert_intermediate_size);
  }
  // Other models with a shared expert (Qwen2-MoE) carry these keys: refused by name rather than
  // run without it.
  for (const char* key : {"shared_expert_intermediate_size", "n_shared_experts"}) {
    if (f.Has(key) && !(f.At(key).is_number_integer() && f.At(key).get<int64_t>() == 0)) {
      return f.Error(key, "shared experts are not supported by the qwen3_moe target");
    }
  }
  return absl::OkStatus();
}

// The gated delta-rule layers of hybrid models and their attention layers' partial RoPE
// (transformers' Qwen3NextConfig / Qwen3_5TextConfig names and defaults).
absl::Status ParseLinearAttention(const Fields& f, TransformerConfig* cfg) {
  cfg->attn_output_gate = true;
  cfg->zero_centered_norm = true;
  cfg->fused_linear_projections = cfg->model_type == "qwen3_next";
  cfg->linear_conv_kernel_dim = 4;
  cfg->linear_key_head_dim = 128;
  cfg->linear_value_head_dim = 128;
  cfg->linear_num_key_heads = 16;
  cfg->linear_num_value_heads = 32;
  RETURN_IF_ERROR(f.Int("linear_conv_kernel_dim", false, 1, 64, &cfg->linear_conv_kernel_dim));
  RETURN_IF_ERROR(f.Int("linear_key_head_dim", false, 1, kMaxHeadDim, &cfg->linear_key_head_dim));
  RETURN_IF_ERROR(
      f.Int("linear_value_head_dim", false, 1, kMaxHeadDim, &cfg->linear_value_head_dim));
  RETURN_IF_ERROR(f.Int("linear_num_key_heads", false, 1, kMaxHeads, &cfg->linear_num_key_heads));
  RETURN_IF_ERROR(
      f.Int("linear_num_value_heads", false, 1, kMaxHeads, &cfg->linear_num_value_heads));
  if (cfg->linear_num_value_heads % cfg->linear_num_key_heads != 0) {
    return f.Error("linear_num_value_heads",
                   absl::StrCat("must be a multiple of linear_num_key_heads (",
                                cfg->linear_num_key_heads, "), got ", cfg->linear_num_value_heads));
  }
  // transformers 5 keeps partial_rotary_factor inside rope_parameters; 4.x at the top level.
  cfg->partial_rotary_factor = 0.25;
  RETURN_IF_ERROR(f.Positive("partial_rotary_factor", false, &cfg->partial_rotary_factor));
  if (f.Has("rope_parameters") && f.At("rope_parameters").is_object()) {
    Fields r(f.At("rope_parameters"), f.source(), "rope_parameters.");
    RETURN_IF_ERROR(r.Positive("partial_rotary_factor", false, &cfg->partial_rotary_factor));
  }
  const int64_t rotary = RotaryDim(*cfg);
  if (cfg->partial_rotary_factor > 1.0 || rotary < 2 || rotary % 2 != 0) {
    return f.Error("partial_rotary_factor",
                   absl::StrCat("must give an even number of rotated dimensions in 2..head_dim (",
                                cfg->head_dim, "), got ", cfg->partial_rotary_factor));
  }
  if (f.Has("layer_types")) {
    RETURN_IF_ERROR(f.StringList("layer_types", &cfg->layer_types));
    if (static_cast<int64_t>(cfg->layer_types.size()) != cfg->num_hidden_layers) {
      return f.Error("layer_types",
                     absl::StrCat("lists ", cfg->layer_types.size(),
                                  " layers; num_hidden_layers is ", cfg->num_hidden_layers));
    }
    for (size_t i = 0; i < cfg->layer_types.size(); ++i) {
      if (cfg->layer_types[i] != "linear_attention" && cfg->layer_types[i] != "full_attention") {
        return f.Error("layer_types",
                       absl::StrCat("layer ", i, " is '", cfg->layer_types[i],
                                    "'; expected linear_attention or full_attention"));
      }
    }
  } else {
    int64_t interval = 4;
    RETURN_IF_ERROR(f.Int("full_attention_interval", false, 1, kMaxLayers, &interval));
    for (int64_t i = 0; i < cfg->num_hidden_layers; ++i) {
      cfg->layer_types.push_back((i + 1) % interval != 0 ? "linear_attention" : "full_attention");
    }
  }
  return absl::OkStatus();
}

bool IsHybridType(const std::string& t) {
  return t == "qwen3_next" || t == "qwen3_5" || t == "qwen3_5_text" || t == "qwen3_5_moe" ||
         t == "qwen3_5_moe_text";
}

// The fields of one decoder config: the whole config.json, or a multimodal one's text_config.
absl::Status ParseDecoder(const Fields& f, TransformerConfig* cfg) {
  const std::string& type = cfg->model_type;
  const bool hybrid = IsHybridType(type);
  const bool moe = type == "qwen3_moe" || type == "qwen3_next" || type == "qwen3_5_moe" ||
                   type == "qwen3_5_moe_text";
  cfg->qk_norm = type != "llama";
  cfg->max_position_embeddings = type == "llama" ? 2048 : 32768;  // transformers' defaults
  if (type == "qwen3_next") cfg->norm_topk_prob = true;           // Qwen3NextConfig's default
  RETURN_IF_ERROR(f.Int("vocab_size", true, 1, kMaxVocab, &cfg->vocab_size));
  RETURN_IF_ERROR(f.Int("hidden_size", true, 1, kMaxHidden, &cfg->hidden_size));
  // Qwen3.5-MoE has no dense MLP layer and no intermediate_size.
  const bool dense_mlp = type != "qwen3_5_moe" && type != "qwen3_5_moe_text";
  RETURN_IF_ERROR(
      f.Int("intermediate_size", dense_mlp, 1, kMaxIntermediate, &cfg->intermediate_size));
  RETURN_IF_ERROR(f.Int("num_hidden_layers", true, 1, kMaxLayers, &cfg->num_hidden_layers));
  RETURN_IF_ERROR(
      f.Int("max_position_embeddings", false, 1, kMaxPositions, &cfg->max_position_embeddings));
  RETURN_IF_ERROR(ParseAttention(f, cfg));
  bool drafter = false;
  for (const std::string& a : cfg->architectures) drafter |= (a == "DFlashDraftModel");
  RETURN_IF_ERROR(drafter ? ParseDrafterAttention(f, cfg) : CheckFullAttention(f, hybrid));
  RETURN_IF_ERROR(CheckActivation(f));
  RETURN_IF_ERROR(f.Positive("rms_norm_eps", false, &cfg->rms_norm_eps));
  RETURN_IF_ERROR(ParseRope(f, cfg));
  RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &cfg->tie_word_embeddings));
  // transformers >= 4.56 writes "dtype"; older releases "torch_dtype".
  RETURN_IF_ERROR(
      f.String(f.Has("torch_dtype") ? "torch_dtype" : "dtype", false, &cfg->torch_dtype));
  if (hybrid) RETURN_IF_ERROR(ParseLinearAttention(f, cfg));
  if (moe) RETURN_IF_ERROR(ParseMoe(f, /*shared_expert=*/type != "qwen3_moe", cfg));
  return absl::OkStatus();
}

absl::StatusOr<TransformerConfig> ParseObject(const json& root, const std::string& source) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": must be a JSON object, got ", root.type_name()));
  }
  Fields top(root, source);
  TransformerConfig cfg;
  RETURN_IF_ERROR(top.String("model_type", true, &cfg.model_type));
  const std::string& type = cfg.model_type;
  const std::vector<std::string>& types = TargetModelTypes();
  if (std::find(types.begin(), types.end(), type) == types.end()) {
    return top.Error("model_type", absl::StrCat("unsupported '", type,
                                                "' (supported: ", absl::StrJoin(types, ", "), ")"));
  }
  RETURN_IF_ERROR(top.StringList("architectures", &cfg.architectures));
  if (type == "qwen3_5" || type == "qwen3_5_moe") {
    // A vision-language checkpoint: dflash runs its text backbone (model.language_model.*).
    if (!top.Has("text_config") || !top.At("text_config").is_object()) {
      return top.Error("text_config", absl::StrCat("required: the language model's config of a ",
                                                   type, " checkpoint"));
    }
    Fields text(top.At("text_config"), source, "text_config.");
    RETURN_IF_ERROR(ParseDecoder(text, &cfg));
    RETURN_IF_ERROR(top.Bool("tie_word_embeddings", &cfg.tie_word_embeddings));
    RETURN_IF_ERROR(
        top.String(top.Has("torch_dtype") ? "torch_dtype" : "dtype", false, &cfg.torch_dtype));
    cfg.weight_prefix = "model.language_model.";
    return cfg;
  }
  RETURN_IF_ERROR(ParseDecoder(top, &cfg));
  RETURN_IF_ERROR(ParseDrafter(top, &cfg));
  return cfg;
}

}  // namespace

absl::StatusOr<TransformerConfig> ParseHfConfig(const std::string& json_text,
                                                const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.size() > 240) what = absl::StrCat(what.substr(0, 240), "...");
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", what));
  }
  try {
    return ParseObject(root, source);
  } catch (const std::exception& e) {  // every access is type-checked first; kept as a backstop
    return absl::InternalError(absl::StrCat(source, ": ", e.what()));
  }
}

absl::StatusOr<TransformerConfig> LoadHfConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ParseHfConfig(text.str(), path);
}

bool IsMoeLayer(const TransformerConfig& c, int64_t layer) {
  if (c.num_experts <= 0 || c.decoder_sparse_step <= 0) return false;
  for (int64_t id : c.mlp_only_layers) {
    if (id == layer) return false;
  }
  return (layer + 1) % c.decoder_sparse_step == 0;
}

const std::vector<std::string>& TargetModelTypes() {
  static const std::vector<std::string>* const types =
      new std::vector<std::string>{"qwen3",   "qwen3_moe",    "llama",       "qwen3_next",
                                   "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"};
  return *types;
}

bool IsLinearAttentionLayer(const TransformerConfig& c, int64_t layer) {
  return layer >= 0 && layer < static_cast<int64_t>(c.layer_types.size()) &&
         c.layer_types[static_cast<size_t>(layer)] == "linear_attention";
}

bool IsHybrid(const TransformerConfig& c) {
  for (const std::string& t : c.layer_types) {
    if (t == "linear_attention") return true;
  }
  return false;
}

int64_t RotaryDim(const TransformerConfig& c) {
  return static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
}

std::vector<int64_t> DefaultTargetLayerIds(int64_t num_target_layers, int64_t k) {
  if (k <= 0 || num_target_layers <= 0) return {};
  if (k == 1) return {num_target_layers / 2};
  // Same arithmetic as the reference Python, round(1 + i * span / (k - 1)): the double division is
  // correctly rounded, so exact halves stay exact and nearbyint (round-half-even under the default
  // rounding mode) matches Python's round().
  const int64_t span = num_target_layers - 4;
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    const double x = 1.0 + static_cast<double>(i * span) / static_cast<double>(k - 1);
    ids.push_back(static_cast<int64_t>(std::nearbyint(x)));
  }
  return ids;
}

namespace {

absl::Status Divides(int64_t world, int64_t value, const char* field) {
  if (value % world == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor parallelism over ", world,
                                                 " processes: ", field, " ", value,
                                                 " is not a multiple of ", world));
}

}  // namespace

absl::Status CheckTensorParallel(const model::TransformerConfig& c, int64_t num_layers,
                                 int64_t world) {
  if (world < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism over ", world, " processes: need at least 1"));
  }
  bool attention = false, linear = false, dense = false, moe = false;
  for (int64_t i = 0; i < num_layers; ++i) {
    (model::IsLinearAttentionLayer(c, i) ? linear : attention) = true;
    (model::IsMoeLayer(c, i) ? moe : dense) = true;
  }
  if (attention) {
    if (auto s = Divides(world, c.num_attention_heads, "num_attention_heads"); !s.ok()) return s;
    if (auto s = Divides(world, c.num_key_value_heads, "num_key_value_heads"); !s.ok()) return s;
  }
  if (linear) {
    if (auto s = Divides(world, c.linear_num_key_heads, "linear_num_key_heads"); !s.ok()) return s;
    if (auto s = Divides(world, c.linear_num_value_heads, "linear_num_value_heads"); !s.ok()) {
      return s;
    }
  }
  if (dense) {
    if (auto s = Divides(world, c.intermediate_size, "intermediate_size"); !s.ok()) return s;
  }
  if (moe) {
    if (auto s = Divides(world, c.moe_intermediate_size, "moe_intermediate_size"); !s.ok()) {
      return s;
    }
    if (auto s =
            Divides(world, c.shared_expert_intermediate_size, "shared_expert_intermediate_size");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace dflash::model

#include "common/drafter/drafter_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/config/run_spec.h"
#include "common/drafter/drafter_prepared.h"
#include "common/drafter/fp8_linear.h"
#include "common/drafter/lean_ops.h"
#include "common/nn/layers.h"
#include "common/nn/torch_status.h"
#ifdef DFLASH_HAVE_FUSED_SWIGLU
#include "common/kernels/swiglu/swiglu.h"
#endif
#ifdef DFLASH_HAVE_FUSED_BLOCK_CONV
#include "common/kernels/block_conv/block_conv.h"
#endif

namespace dflash::drafter {
namespace {

// A LibTorch error as a status: RESOURCE_EXHAUSTED for any out-of-memory (the trainer recovers
// from it by splitting the micro-batch), INTERNAL otherwise.
absl::Status TorchError(const c10::Error& e, const char* what) { return nn::TorchStatus(e, what); }

constexpr int64_t kMaxDrafterLayers = 1024;
constexpr int64_t kMaxBlockSize = 1024;

struct LayerSpec {
  std::string suffix;
  std::vector<int64_t> shape;
  at::Tensor DrafterLayerParams::*field;
};

std::vector<LayerSpec> LayerSpecs(const DrafterConfig& config) {
  const model::TransformerConfig& c = config.target;
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  std::vector<LayerSpec> specs = {
      {"input_layernorm.weight", {h}, &DrafterLayerParams::input_norm},
      {"self_attn.q_proj.weight", {q, h}, &DrafterLayerParams::q_proj},
      {"self_attn.k_proj.weight", {kv, h}, &DrafterLayerParams::k_proj},
      {"self_attn.v_proj.weight", {kv, h}, &DrafterLayerParams::v_proj},
      {"self_attn.o_proj.weight", {h, q}, &DrafterLayerParams::o_proj},
      {"self_attn.q_norm.weight", {d}, &DrafterLayerParams::q_norm},
      {"self_attn.k_norm.weight", {d}, &DrafterLayerParams::k_norm},
      {"post_attention_layernorm.weight", {h}, &DrafterLayerParams::post_norm},
      {"mlp.gate_proj.weight", {inter, h}, &DrafterLayerParams::gate},
      {"mlp.up_proj.weight", {inter, h}, &DrafterLayerParams::up},
      {"mlp.down_proj.weight", {h, inter}, &DrafterLayerParams::down},
  };
  if (config.dflash2()) {
    const int64_t k = config.conv_kernel_size, g = h / config.conv_group_size;
    specs.push_back({"attention_conv.base_kernel", {2, k, h}, &DrafterLayerParams::attn_conv_base});
    specs.push_back({"attention_conv.kernel_projection.weight",
                     {2 * k * g, h},
                     &DrafterLayerParams::attn_conv_proj});
    specs.push_back({"mlp_conv.base_kernel", {2, k, h}, &DrafterLayerParams::mlp_conv_base});
    specs.push_back(
        {"mlp_conv.kernel_projection.weight", {2 * k * g, h}, &DrafterLayerParams::mlp_conv_proj});
  }
  return specs;
}

bool IsNormName(const std::string& name) {
  return name.find("norm") != std::string::npos;  // *_layernorm, *_norm, hidden_norm, norm
}

absl::Status FieldError(const std::string& field, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("drafter config: ", field, ": ", msg));
}

absl::Status ValidateTargetShape(const model::TransformerConfig& t) {
  if (t.hidden_size < 1 || t.intermediate_size < 1 || t.vocab_size < 1 || t.num_hidden_layers < 1) {
    return FieldError("target",
                      "hidden_size, intermediate_size, vocab_size and "
                      "num_hidden_layers must be positive");
  }
  if (t.num_attention_heads < 1 || t.num_key_value_heads < 1 ||
      t.num_attention_heads % t.num_key_value_heads != 0) {
    return FieldError("target.num_attention_heads",
                      absl::StrCat(t.num_attention_heads, " is not a positive multiple of ",
                                   "num_key_value_heads ", t.num_key_value_heads));
  }
  if (t.head_dim < 2 || t.head_dim % 2 != 0) {
    return FieldError("target.head_dim",
                      absl::StrCat("must be even and positive, got ", t.head_dim));
  }
  if (!(t.rms_norm_eps > 0) || !(t.rope_theta > 0)) {
    return FieldError("target", "rms_norm_eps and rope_theta must be positive");
  }
  if (t.rope_scaling.has_value() && t.rope_scaling->rope_type != "llama3") {
    return FieldError("target.rope_scaling",
                      absl::StrCat("unsupported type '", t.rope_scaling->rope_type, "'"));
  }
  return absl::OkStatus();
}

// Document offsets from cu_seqlens [b+1] int32 running from 0 to t, nondecreasing.
absl::StatusOr<std::vector<int64_t>> ReadOffsets(const at::Tensor& cu_seqlens, int64_t t) {
  if (!cu_seqlens.defined() || cu_seqlens.dim() != 1 || cu_seqlens.scalar_type() != at::kInt ||
      cu_seqlens.size(0) < 1) {
    return absl::InvalidArgumentError("cu_seqlens must be a non-empty 1-D int32 tensor");
  }
  at::Tensor host = cu_seqlens.to(at::kCPU).contiguous();
  const int32_t* cu = host.data_ptr<int32_t>();
  std::vector<int64_t> offsets(cu, cu + host.numel());
  if (offsets.front() != 0 || offsets.back() != t) {
    return absl::InvalidArgumentError(absl::StrCat("cu_seqlens runs from ", offsets.front(), " to ",
                                                   offsets.back(), ", expected 0 to ", t));
  }
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("cu_seqlens decreases at index ", i));
    }
  }
  return offsets;
}

// anchors [n] int64: -1 (padding) or in [0, t), the others strictly ascending.
absl::Status CheckAnchors(const at::Tensor& anchors, int64_t t) {
  if (!anchors.defined() || anchors.dim() != 1 || anchors.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError("anchors must be a 1-D int64 tensor");
  }
  at::Tensor host = anchors.to(at::kCPU).contiguous();
  const int64_t* a = host.data_ptr<int64_t>();
  int64_t last = -1;
  for (int64_t j = 0; j < host.numel(); ++j) {
    if (a[j] == -1) continue;
    if (a[j] < 0 || a[j] >= t || a[j] <= last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "anchors[", j, "] = ", a[j], ": anchors must be -1 (padding) or rows in [0, ", t,
          "), strictly ascending"));
    }
    last = a[j];
  }
  return absl::OkStatus();
}

absl::Status CheckRowTensor(const at::Tensor& x, const char* name, int64_t t, bool int64_only) {
  if (!x.defined() || x.dim() != 1 || x.size(0) != t ||
      (int64_only && x.scalar_type() != at::kLong)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be a 1-D ", int64_only ? "int64 " : "", "tensor of ", t, " rows"));
  }
  return absl::OkStatus();
}

std::string Shape(const at::Tensor& x) {
  return x.defined() ? absl::StrCat("[", absl::StrJoin(x.sizes(), ", "), "]") : "undefined";
}

// Shapes, dtypes and values of a batch; returns the document offsets.
absl::StatusOr<std::vector<int64_t>> ValidateBatch(const DrafterBatch& batch,
                                                   const DrafterConfig& config,
                                                   bool with_loss_mask) {
  const at::Tensor& f = batch.features;
  if (!f.defined() || f.dim() != 2 || f.size(1) != config.feature_dim() ||
      !c10::isFloatingType(f.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat("features must be a floating-point [T, ",
                                                   config.feature_dim(), "] tensor, got ",
                                                   Shape(f)));
  }
  const int64_t t = f.size(0);
  RETURN_IF_ERROR(CheckRowTensor(batch.input_ids, "input_ids", t, true));
  RETURN_IF_ERROR(CheckRowTensor(batch.positions, "positions", t, true));
  if (with_loss_mask) RETURN_IF_ERROR(CheckRowTensor(batch.loss_mask, "loss_mask", t, false));
  ASSIGN_OR_RETURN(std::vector<int64_t> offsets, ReadOffsets(batch.cu_seqlens, t));
  RETURN_IF_ERROR(CheckAnchors(batch.anchors, t));
  if (batch.block_lengths.defined()) {
    const at::Tensor& l = batch.block_lengths;
    if (l.dim() != 1 || l.scalar_type() != at::kLong || l.size(0) != batch.anchors.size(0) ||
        (l.numel() > 0 &&
         (l.min().item<int64_t>() < 1 || l.max().item<int64_t>() > config.block_size))) {
      return absl::InvalidArgumentError(
          absl::StrCat("block_lengths must be a 1-D int64 tensor of one length in [1, ",
                       config.block_size, "] per anchor, got ", Shape(l)));
    }
  }
  if (t > 0) {
    const int64_t lo = batch.input_ids.min().item<int64_t>();
    const int64_t hi = batch.input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= config.target.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids span [", lo, ", ", hi,
                                                     "], outside the vocabulary [0, ",
                                                     config.target.vocab_size, ")"));
    }
  }
  return offsets;
}

}  // namespace

std::optional<Recompute> ParseRecompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "mlp") return Recompute::kMlp;
  if (name == "layers") return Recompute::kLayers;
  return std::nullopt;
}

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kMlp:
      return "mlp";
    case Recompute::kLayers:
      return "layers";
    case Recompute::kNone:
      break;
  }
  return "none";
}

double ExpectedAcceptanceLength(const std::vector<int64_t>& slot_correct,
                                const std::vector<int64_t>& slot_total) {
  double tau = 1.0, prefix = 1.0;
  for (size_t k = 1; k < slot_correct.size() && k < slot_total.size(); ++k) {
    const double acc = slot_total[k] > 0 ? static_cast<double>(slot_correct[k]) /
                                               static_cast<double>(slot_total[k])
                                         : 0.0;
    prefix *= acc;
    tau += prefix;
  }
  return tau;
}

std::vector<std::string> LayerTypes(const DrafterConfig& c) {
  if (!c.layer_types.empty()) return c.layer_types;
  return std::vector<std::string>(static_cast<size_t>(std::max<int64_t>(c.num_layers, 0)),
                                  "full_attention");
}

std::vector<int64_t> SlidingLayerIds(const DrafterConfig& c) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.sliding(i)) ids.push_back(i);
  }
  return ids;
}

void SetSlidingLayers(DrafterConfig* c, const std::vector<int64_t>& ids, int64_t window) {
  c->layer_types.clear();
  c->sliding_window = 0;
  if (ids.empty()) return;
  c->layer_types.assign(static_cast<size_t>(c->num_layers), "full_attention");
  for (int64_t i : ids) c->layer_types[static_cast<size_t>(i)] = "sliding_attention";
  c->sliding_window = window;
}

absl::Status ValidateDrafterConfig(const DrafterConfig& c) {
  RETURN_IF_ERROR(ValidateTargetShape(c.target));
  if (c.num_layers < 1 || c.num_layers > kMaxDrafterLayers) {
    return FieldError("num_layers",
                      absl::StrCat("must be in 1..", kMaxDrafterLayers, ", got ", c.num_layers));
  }
  if (c.block_size < 2 || c.block_size > kMaxBlockSize) {
    return FieldError("block_size",
                      absl::StrCat("must be in 2..", kMaxBlockSize, ", got ", c.block_size));
  }
  if (c.mask_token_id < 0 || c.mask_token_id >= c.target.vocab_size) {
    return FieldError(
        "mask_token_id",
        absl::StrCat(c.mask_token_id, " is outside the vocabulary [0, ", c.target.vocab_size, ")"));
  }
  if (c.target_layer_ids.empty()) return FieldError("target_layer_ids", "must not be empty");
  if (!c.layer_types.empty() && static_cast<int64_t>(c.layer_types.size()) != c.num_layers) {
    return FieldError("layer_types", absl::StrCat("lists ", c.layer_types.size(),
                                                  " layers; the drafter has ", c.num_layers));
  }
  for (size_t i = 0; i < c.layer_types.size(); ++i) {
    if (c.layer_types[i] != "full_attention" && c.layer_types[i] != "sliding_attention") {
      return FieldError("layer_types",
                        absl::StrCat("layer ", i, " is '", c.layer_types[i],
                                     "'; a drafter layer is full_attention or sliding_attention"));
    }
  }
  if (c.sliding_window < 0) {
    return FieldError("sliding_window", absl::StrCat("must be at least 0, got ", c.sliding_window));
  }
  RETURN_IF_ERROR(ValidateDflash2Config(c));
  std::set<int64_t> seen;
  for (int64_t id : c.target_layer_ids) {
    if (id < 0 || id >= c.target.num_hidden_layers) {
      return FieldError("target_layer_ids", absl::StrCat("layer ", id, " is outside [0, ",
                                                         c.target.num_hidden_layers, ")"));
    }
    if (!seen.insert(id).second) {
      return FieldError("target_layer_ids", absl::StrCat("layer ", id, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

std::vector<NamedParameter> ParameterSpecs(const DrafterConfig& c) {
  const int64_t h = c.target.hidden_size;
  std::vector<NamedParameter> specs = {{"fc.weight", {h, c.feature_dim()}, {}},
                                       {"hidden_norm.weight", {h}, {}}};
  const std::vector<LayerSpec> layer = LayerSpecs(c);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (const LayerSpec& s : layer) {
      specs.push_back({absl::StrCat("layers.", i, ".", s.suffix), s.shape, {}});
    }
  }
  specs.push_back({"norm.weight", {h}, {}});
  if (c.dflash2()) {
    const int64_t v = c.target.vocab_size, r = c.selector_rank;
    specs.push_back({"candidate_selector.predecessor_codebook", {v, r}, {}});
    specs.push_back({"candidate_selector.successor_codebook", {v, r}, {}});
    specs.push_back({"candidate_selector.hidden_projection.weight", {r, h}, {}});
  }
  return specs;
}

DrafterModel::DrafterModel(DrafterConfig config, DrafterOptions options)
    : config_(std::move(config)),
      options_(options),
      attention_(std::make_shared<FusedDrafterAttention>()) {}

DrafterModel::~DrafterModel() = default;

absl::StatusOr<std::unique_ptr<DrafterModel>> DrafterModel::Create(const DrafterConfig& config,
                                                                   const DrafterOptions& options,
                                                                   const at::Tensor& embed_tokens,
                                                                   const at::Tensor& lm_head) {
  RETURN_IF_ERROR(ValidateDrafterConfig(config));
  for (c10::ScalarType t : {options.dtype, options.compute_dtype.value_or(options.dtype)}) {
    if (!c10::isFloatingType(t)) {
      return absl::InvalidArgumentError(
          absl::StrCat("drafter dtype ", c10::toString(t), " is not floating-point"));
    }
  }
  if (options.fp8) {
    if (options.compute_dtype.value_or(options.dtype) != c10::ScalarType::BFloat16) {
      return absl::InvalidArgumentError(
          absl::StrCat("drafter.precision: fp8 needs the bf16 compute dtype (target.dtype: "
                       "bfloat16), got ",
                       c10::toString(options.compute_dtype.value_or(options.dtype))));
    }
    const auto& c = config.target;
    for (int64_t dim : {c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim,
                        c.num_key_value_heads * c.head_dim, config.feature_dim()}) {
      if (dim % 16 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "drafter.precision: fp8 needs every projection's sizes to be multiples of 16; this "
            "drafter has one of ",
            dim));
      }
    }
  }
  const std::vector<int64_t> vh = {config.target.vocab_size, config.target.hidden_size};
  auto check_frozen = [&](const char* name, const at::Tensor& x) -> absl::Status {
    if (x.defined() && x.sizes().vec() == vh && c10::isFloatingType(x.scalar_type())) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat("drafter ", name, " must be a floating-point [",
                                                   vh[0], ", ", vh[1], "] tensor, got ", Shape(x)));
  };
  RETURN_IF_ERROR(check_frozen("embed_tokens", embed_tokens));
  RETURN_IF_ERROR(check_frozen("lm_head", lm_head));
  try {
    std::unique_ptr<DrafterModel> m(new DrafterModel(config, options));
    m->InitParameters(embed_tokens, lm_head);
    return m;
  } catch (const c10::Error& e) {
    return TorchError(e, "creating the drafter");
  }
}

void DrafterModel::InitParameters(const at::Tensor& embed_tokens, const at::Tensor& lm_head) {
  at::NoGradGuard no_grad;
  const c10::Device device = options_.device;
  // Frozen: detached, so that no gradient is ever computed for them; moved once to the device.
  lm_head_ = lm_head.detach().to(device);
  // The embedding serves only the n + 1 distinct rows of a batch's blocks (EmbedBlocks): an untied
  // table stays in host memory (1.16 GiB of device memory less at Qwen3-8B's shape).
  embed_tokens_ =
      lm_head.is_same(embed_tokens) ? lm_head_ : embed_tokens.detach().to(c10::DeviceType::CPU);
  inv_freq_ = nn::RopeInvFreq(config_.target).to(device);
  at::Generator gen = at::detail::createCPUGenerator(options_.seed);
  std::map<std::string, at::Tensor> by_name;
  params_ = ParameterSpecs(config_);
  for (NamedParameter& p : params_) {
    at::Tensor cpu = IsNormName(p.name) ? at::ones(p.shape, at::kFloat)
                                        : at::randn(p.shape, gen, at::kFloat) * options_.init_std;
    // DFlash2's convolutions start as the identity (DFlash's layer): tap 0 of the base kernel 1,
    // the rest and the kernel projection 0.
    if (absl::EndsWith(p.name, "conv.base_kernel")) {
      cpu = at::zeros(p.shape, at::kFloat);
      cpu.select(1, 0).fill_(1.0);
    } else if (absl::StrContains(p.name, "conv.kernel_projection")) {
      cpu = at::zeros(p.shape, at::kFloat);
    }
    p.tensor = cpu.to(device, options_.dtype).detach().requires_grad_(true);
    by_name[p.name] = p.tensor;
  }
  fc_ = by_name.at("fc.weight");
  hidden_norm_ = by_name.at("hidden_norm.weight");
  norm_ = by_name.at("norm.weight");
  if (config_.dflash2()) {
    predecessor_codebook_ = by_name.at("candidate_selector.predecessor_codebook");
    successor_codebook_ = by_name.at("candidate_selector.successor_codebook");
    selector_projection_ = by_name.at("candidate_selector.hidden_projection.weight");
  }
  layers_.assign(static_cast<size_t>(config_.num_layers), DrafterLayerParams{});
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (const LayerSpec& s : LayerSpecs(config_)) {
      layers_[i].*s.field = by_name.at(absl::StrCat("layers.", i, ".", s.suffix));
    }
  }
}

absl::StatusOr<DrafterModel::Prepared> DrafterModel::Prepare(const DrafterBatch& batch,
                                                             bool for_targets) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> offsets, ValidateBatch(batch, config_, for_targets));
  const c10::Device device = options_.device;
  Prepared p;
  p.t = batch.features.size(0);
  std::vector<int64_t> doc_ids(static_cast<size_t>(p.t));
  for (size_t d = 0; d + 1 < offsets.size(); ++d) {
    for (int64_t r = offsets[d]; r < offsets[d + 1]; ++r) doc_ids[r] = static_cast<int64_t>(d);
  }
  p.n = batch.anchors.size(0);
  p.features = batch.features.to(device);
  p.input_ids = batch.input_ids.to(device);
  p.doc_ids = at::tensor(doc_ids, at::kLong).to(device);
  p.anchors = batch.anchors.to(device);
  if (for_targets) p.loss_mask = batch.loss_mask.to(device).ne(0).to(at::kFloat);
  // The targets need nothing of the forward's (no RoPE tables, no attention plan, whose schedule
  // is built on the host: in the loss, after the forward was queued, it would leave the device
  // idle).
  if (for_targets) return p;
  const int64_t b = config_.block_size;
  const auto long_opts = p.anchors.options();
  at::Tensor valid = p.anchors.ge(0);
  at::Tensor a = p.anchors.clamp_min(0);
  // Slot 0's tokens from the batch as given (host tensors in a worker), where the embedding
  // gathers them: no device round trip for a table in host memory.
  const at::Tensor given_anchors = batch.anchors.to(batch.input_ids.device());
  p.slot0_tokens =
      p.t > 0 ? at::where(given_anchors.ge(0),
                          batch.input_ids.to(at::kLong).index_select(0, given_anchors.clamp_min(0)),
                          at::full({p.n}, config_.mask_token_id, given_anchors.options()))
              : at::full({p.n}, config_.mask_token_id, given_anchors.options());
  at::Tensor positions = batch.positions.to(device);
  at::Tensor base = p.t > 0 ? at::where(valid, positions.index_select(0, a), at::zeros_like(a)) : a;
  at::Tensor block_pos = (base.unsqueeze(1) + at::arange(b, long_opts).unsqueeze(0)).reshape({-1});
  p.q_rope = nn::MakeRopeTables(block_pos, inv_freq_, compute_dtype());
  nn::RopeTables ctx_rope = nn::MakeRopeTables(positions, inv_freq_, compute_dtype());
  p.k_rope = {at::cat({ctx_rope.cos, p.q_rope.cos}, 0), at::cat({ctx_rope.sin, p.q_rope.sin}, 0)};
  p.mask = BuildBlockMask(p.anchors, p.doc_ids, b, batch.block_lengths);
  return p;
}

at::Tensor DrafterModel::RunForward(const std::shared_ptr<const Prepared>& prepared,
                                    const at::Tensor& features) const {
  const Prepared& p = *prepared;
  const double eps = config_.target.rms_norm_eps;
  // Block stream [Q, H] from the frozen embedding; ctx [T, H] = hidden_norm(fc(features)), shared
  // by every layer (no input norm on it).
  const c10::ScalarType dtype = compute_dtype();
  // ctx first: its GEMM runs on the device while the host gathers the block rows.
  at::Tensor ctx = nn::RmsNorm(Linear(features.to(dtype), fc_), hidden_norm_.to(dtype), eps);
  at::Tensor x = EmbedBlocks(p).to(dtype);
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    const DrafterLayerParams& w = layers_[static_cast<size_t>(i)];
    if (options_.recompute != Recompute::kLayers) {
      x = RunLayer(i, x, ctx, p);
      continue;
    }
    // Only x and ctx are kept; the backward runs the layer again (`prepared` lives as long as the
    // graph does).
    std::vector<at::Tensor> weights;
    for (const LayerSpec& s : LayerSpecs(config_)) weights.push_back(w.*s.field);
    x = Checkpoint(
        [this, i, prepared](const std::vector<at::Tensor>& in) {
          return RunLayer(i, in[0], in[1], *prepared);
        },
        {x, ctx}, weights);
  }
  return nn::RmsNorm(x, norm_.to(dtype), eps);
}

at::Tensor DrafterModel::EmbedBlocks(const Prepared& p) const {
  // Block j is [input_ids[a_j], MASK, ..., MASK]: n + 1 distinct rows of the frozen embedding,
  // gathered where the table lives (host memory for a CUDA drafter) and expanded on the device.
  const c10::Device table = embed_tokens_.device();
  at::Tensor ids =
      at::cat({p.slot0_tokens, at::full({1}, config_.mask_token_id, p.slot0_tokens.options())});
  at::Tensor rows;  // [n + 1, H]
  if (!table.is_cpu() || !options_.device.is_cuda()) {
    // The table where the drafter runs (or both on the host): a device "cuda" without an index
    // is the same GPU as the table's "cuda:0", so the kinds are compared, not the devices.
    rows = at::embedding(embed_tokens_, ids.to(table)).to(options_.device);
  } else {
    // Host table, CUDA drafter: each row copied whole into pinned memory (at::embedding's CPU
    // gather of a bf16 table took 4 ms for 513 rows of 4096 on the H200 host), then one
    // asynchronous upload (a pageable one would first wait for the device to drain).
    const at::Tensor host_ids = ids.to(at::kCPU, at::kLong).contiguous();
    const int64_t count = host_ids.numel(), vocab = embed_tokens_.size(0);
    const size_t row_bytes = static_cast<size_t>(embed_tokens_.size(1)) *
                             static_cast<size_t>(embed_tokens_.element_size());
    at::Tensor staged =
        at::empty({count, embed_tokens_.size(1)}, embed_tokens_.options().pinned_memory(true));
    const auto* src = static_cast<const uint8_t*>(embed_tokens_.data_ptr());
    auto* dst = static_cast<uint8_t*>(staged.data_ptr());
    const int64_t* id = host_ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      TORCH_CHECK(id[i] >= 0 && id[i] < vocab, "embedding id ", id[i], " outside [0, ", vocab, ")");
      std::memcpy(dst + static_cast<size_t>(i) * row_bytes,
                  src + static_cast<size_t>(id[i]) * row_bytes, row_bytes);
    }
    rows = staged.to(options_.device, /*non_blocking=*/true);
  }
  const int64_t h = rows.size(1), b = config_.block_size;
  if (config_.input_embedding_scale != 1.0) rows = rows * config_.input_embedding_scale;
  at::Tensor mask = rows.narrow(0, p.n, 1).unsqueeze(0).expand({p.n, b - 1, h});
  return at::cat({rows.narrow(0, 0, p.n).unsqueeze(1), mask}, 1).reshape({p.n * b, h});
}

at::Tensor DrafterModel::RunLayer(int64_t layer, const at::Tensor& x, const at::Tensor& ctx,
                                  const Prepared& p) const {
  const DrafterLayerParams& w = layers_[static_cast<size_t>(layer)];
  const model::TransformerConfig& c = config_.target;
  const int64_t q_rows = x.size(0), kv_rows = ctx.size(0) + q_rows, d = c.head_dim;
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  const double eps = c.rms_norm_eps;
  // The fp32 master weights go in as they are: the lean ops cast them to the compute dtype for
  // their products and again in the backward, so no bf16 copy lives from forward to backward.
  const c10::ScalarType dtype = compute_dtype();

  at::Tensor h = nn::RmsNorm(x, w.input_norm.to(dtype), eps);
  at::Tensor attn_delta;  // DFlash2: the attention's output-side kernel offsets
  if (config_.dflash2()) std::tie(h, attn_delta) = ConvIn(h, w.attn_conv_base, w.attn_conv_proj);
  // The same k_proj / k_norm / v_proj serve context rows and block rows, projected apart so that
  // the backward keeps ctx (one tensor for every layer) and h, not a [T + Q, H] copy per layer;
  // the products that share an input in one node (lean_ops.h, SharedInputLinear).
  const std::vector<at::Tensor> of_h =
      SharedInputLinear(h, {w.q_proj, w.k_proj, w.v_proj}, dtype, options_.fp8);
  const std::vector<at::Tensor> of_ctx =
      SharedInputLinear(ctx, {w.k_proj, w.v_proj}, dtype, options_.fp8);
  at::Tensor q = nn::RmsNorm(of_h[0].reshape({q_rows, hq, d}), w.q_norm.to(dtype), eps);
  q = nn::ApplyRope(q, p.q_rope);  // at the block positions
  at::Tensor k = nn::RmsNorm(at::cat({of_ctx[0], of_h[1]}, 0).reshape({kv_rows, hkv, d}),
                             w.k_norm.to(dtype), eps);
  k = nn::ApplyRope(k, p.k_rope);  // context positions, then block positions
  at::Tensor v = at::cat({of_ctx[1], of_h[2]}, 0).reshape({kv_rows, hkv, d});
  return FinishLayer(layer, x, q, k, v, p, attn_delta);
}

std::string DrafterModel::AttentionKernels() const {
  const model::TransformerConfig& t = config_.target;
  std::vector<int64_t> windows;  // per layer, 0 for none
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    windows.push_back(config_.sliding(i) ? config_.sliding_window : 0);
  }
  const bool fused = dynamic_cast<const FusedDrafterAttention*>(attention_.get()) != nullptr;
  return AttentionKernelReport(
      {options_.device, compute_dtype(), t.head_dim,
       t.num_attention_heads / std::max<int64_t>(1, t.num_key_value_heads), config_.block_size},
      windows, fused);
}

std::string DrafterModel::Kernels() const {
  const bool cuda = options_.device.is_cuda();
  bool swiglu = false, block_conv = false;
#ifdef DFLASH_HAVE_FUSED_SWIGLU
  swiglu = cuda && kernels::FusedSwiGluEnabled();
#endif
#ifdef DFLASH_HAVE_FUSED_BLOCK_CONV
  block_conv = cuda && kernels::FusedBlockConvEnabled();
#endif
  std::string out = AttentionKernels();
  out += swiglu ? "; mlp activation: fused swiglu" : "; mlp activation: silu and mul (ATen)";
  if (config_.dflash2()) {
    out += block_conv ? "; block convolution: fused" : "; block convolution: composition (ATen)";
  }
  return out;
}

at::Tensor DrafterModel::Linear(const at::Tensor& x, const at::Tensor& weight) const {
  return options_.fp8 ? Fp8Linear(x, weight, compute_dtype())
                      : CastLinear(x, weight, compute_dtype());
}

at::Tensor DrafterModel::Mlp(const at::Tensor& h, const DrafterLayerParams& w) const {
  return SwiGluMlp(h, w.gate, w.up, w.down, compute_dtype(), options_.recompute == Recompute::kMlp,
                   options_.fp8);
}

at::Tensor DrafterModel::FinishLayer(int64_t layer, const at::Tensor& x, const at::Tensor& q,
                                     const at::Tensor& k, const at::Tensor& v, const Prepared& p,
                                     const at::Tensor& attn_delta) const {
  const DrafterLayerParams& w = layers_[static_cast<size_t>(layer)];
  const model::TransformerConfig& c = config_.target;
  const int64_t q_rows = x.size(0), d = c.head_dim, hq = c.num_attention_heads;
  const c10::ScalarType dtype = compute_dtype();
  const double scale = std::pow(static_cast<double>(d), -0.5);
  BlockMask mask = p.mask;  // a sliding layer's view of it (the tensors are shared)
  if (config_.sliding(layer)) {
    mask.causal = true;
    mask.window = config_.sliding_window;
  }
  at::Tensor attn = attention_->Forward(q, k, v, mask, scale).reshape({q_rows, hq * d});
  at::Tensor out = Linear(attn, w.o_proj);  // [Q, H]
  if (attn_delta.defined()) out = ConvOut(out, attn_delta, w.attn_conv_base);
  at::Tensor y = x + out;

  at::Tensor h = nn::RmsNorm(y, w.post_norm.to(dtype), c.rms_norm_eps);
  if (!config_.dflash2()) {
    return y + Mlp(h, w);
  }
  auto [conv_h, mlp_delta] = ConvIn(h, w.mlp_conv_base, w.mlp_conv_proj);
  const at::Tensor m = Mlp(conv_h, w);
  return y + ConvOut(m, mlp_delta, w.mlp_conv_base);
}

absl::StatusOr<at::Tensor> DrafterModel::Forward(const DrafterBatch& batch) const {
  try {
    ASSIGN_OR_RETURN(Prepared p, Prepare(batch, /*for_targets=*/false));
    auto prepared = std::make_shared<const Prepared>(std::move(p));
    return RunForward(prepared, prepared->features);
  } catch (const c10::Error& e) {
    return TorchError(e, "drafter forward");
  }
}

absl::StatusOr<at::Tensor> DrafterModel::Logits(const at::Tensor& hidden) const {
  if (!hidden.defined() || hidden.dim() != 2 || hidden.size(1) != config_.target.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden must be [rows, ", config_.target.hidden_size, "], got ", Shape(hidden)));
  }
  try {
    // As in the loss: the matmul in lm_head's dtype, returned in the compute dtype.
    at::Tensor h = hidden.to(lm_head_.device(), lm_head_.scalar_type());
    at::Tensor logits = at::matmul(h, lm_head_.t()).to(compute_dtype());
    if (config_.output_multiplier != 1.0) logits = logits * config_.output_multiplier;
    if (config_.final_logit_softcapping > 0) {
      const double cap = config_.final_logit_softcapping;
      logits = at::tanh(logits / cap) * cap;
    }
    return logits;
  } catch (const c10::Error& e) {
    return TorchError(e, "drafter logits");
  }
}

BlockTargets DrafterModel::MakeTargets(const Prepared& p, double gamma) const {
  const int64_t b = config_.block_size;
  const auto long_opts = p.anchors.options();
  if (p.t == 0) {  // every block is padding
    return {at::zeros({p.n * b}, long_opts), at::zeros({p.n * b}, long_opts.dtype(at::kFloat))};
  }
  at::Tensor k = at::arange(b, long_opts);           // [B]
  at::Tensor a = p.anchors.clamp_min(0);             // [n]
  at::Tensor row = a.unsqueeze(1) + k.unsqueeze(0);  // [n, B]: a_j + k
  at::Tensor in_range = row.lt(p.t);
  at::Tensor at_row = row.clamp_max(p.t - 1).reshape({-1});  // [Q]
  at::Tensor labels = p.input_ids.index_select(0, at_row);
  at::Tensor same_doc = p.doc_ids.index_select(0, at_row).view({p.n, b}).eq(
                            p.doc_ids.index_select(0, a).unsqueeze(1)) &
                        in_range & p.anchors.ge(0).unsqueeze(1);
  // exp(-(k-1)/gamma) for k >= 1, 0 for slot 0 (never trained).
  at::Tensor decay = at::exp((k.to(at::kFloat) - 1.0) * (-1.0 / gamma)) * k.ge(1).to(at::kFloat);
  at::Tensor weights = decay.unsqueeze(0) * same_doc.to(at::kFloat) *
                       p.loss_mask.index_select(0, at_row).view({p.n, b});
  return {labels, weights.reshape({-1})};
}

absl::StatusOr<BlockTargets> DrafterModel::Targets(const DrafterBatch& batch, double gamma) const {
  if (!(gamma > 0) || !std::isfinite(gamma)) {
    return absl::InvalidArgumentError(absl::StrCat("gamma must be a positive number, got ", gamma));
  }
  try {
    ASSIGN_OR_RETURN(Prepared p, Prepare(batch, /*for_targets=*/true));
    return MakeTargets(p, gamma);
  } catch (const c10::Error& e) {
    return TorchError(e, "drafter targets");
  }
}

}  // namespace dflash::drafter

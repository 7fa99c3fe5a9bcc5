#include "common/drafter/drafter_checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/model/hf_config.h"
#include "common/nn/weights.h"
#include "nlohmann/json.hpp"

namespace dflash::drafter {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfigName = "config.json";
constexpr const char* kArchitecture2 = "DFlash2DraftModel";
constexpr const char* kWeightsName = "model.safetensors";
constexpr const char* kArchitecture = "DFlashDraftModel";

c10::ScalarType ExportScalarType(model::DType dtype) {
  return dtype == model::DType::kF32 ? at::kFloat : at::kBFloat16;
}

nlohmann::ordered_json RopeScalingJson(const model::TransformerConfig& t) {
  if (!t.rope_scaling.has_value()) return nullptr;
  const model::RopeScaling& s = *t.rope_scaling;
  return {{"rope_type", s.rope_type},
          {"factor", s.factor},
          {"low_freq_factor", s.low_freq_factor},
          {"high_freq_factor", s.high_freq_factor},
          {"original_max_position_embeddings", s.original_max_position_embeddings}};
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Errno(const std::string& what) {
  return DFLASH_INTERNAL_ERROR(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Writes `text` to `path` and fsyncs it.
absl::Status WriteFileDurably(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(absl::StrCat("cannot create ", path));
  size_t done = 0;
  absl::Status s;
  while (s.ok() && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) s = Errno(absl::StrCat("writing ", path));
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (s.ok() && ::fsync(fd) != 0) s = Errno(absl::StrCat("fsync ", path));
  if (::close(fd) != 0 && s.ok()) s = Errno(absl::StrCat("close ", path));
  return s;
}

// std::filesystem::remove_all must not be used here: libtorch.so exports its own copy of the
// std::filesystem operations, and that remove_all crashes (a call through a null pointer) on any
// non-empty directory in a process that links LibTorch. Depth-first removal without following
// symbolic links; best effort.
void RemoveTree(const fs::path& path) {
  auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) -> int {
    ::remove(p);
    return 0;
  };
  ::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

void SyncDir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Both files into `tmp`, an empty directory.
absl::Status WriteCheckpointFiles(const DrafterModel& model, const fs::path& tmp,
                                  model::DType dtype) {
  RETURN_IF_ERROR(WriteFileDurably((tmp / kConfigName).string(),
                                   DrafterConfigJson(model.config(), dtype) + "\n"));
  std::vector<at::Tensor> host;  // keeps the converted bytes alive until written
  std::vector<model::TensorToWrite> tensors;
  host.reserve(model.parameters().size());
  for (const NamedParameter& p : model.parameters()) {
    host.push_back(p.tensor.detach().to(at::kCPU, ExportScalarType(dtype)).contiguous());
    tensors.push_back({p.name, dtype, p.shape, host.back().data_ptr(), host.back().nbytes()});
  }
  RETURN_IF_ERROR(
      model::WriteSafetensors((tmp / kWeightsName).string(), tensors, {{"format", "pt"}}));
  SyncDir(tmp);
  return absl::OkStatus();
}

// Moves the finished `tmp` to `dir`, replacing an existing `dir` when `overwrite`.
absl::Status Publish(const fs::path& tmp, const fs::path& dir, bool overwrite) {
  std::error_code ec;
  fs::path old;
  if (fs::exists(dir, ec)) {
    if (!overwrite) {
      return absl::AlreadyExistsError(absl::StrCat(dir.string(), " already exists"));
    }
    std::string aside = dir.string() + ".old-XXXXXX";
    if (::mkdtemp(aside.data()) == nullptr) return Errno(absl::StrCat("mkdtemp ", aside));
    old = aside;
    if (::rename(dir.c_str(), old.c_str()) != 0) {
      const absl::Status s = Errno(absl::StrCat("renaming ", dir.string(), " aside"));
      ::rmdir(old.c_str());
      return s;
    }
  }
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const absl::Status s = Errno(absl::StrCat("renaming ", tmp.string(), " to ", dir.string()));
    if (!old.empty()) (void)::rename(old.c_str(), dir.c_str());  // put the old one back
    return s;
  }
  SyncDir(dir.parent_path());
  if (!old.empty()) RemoveTree(old);
  return absl::OkStatus();
}

absl::Status Mismatch(const std::string& source, const std::string& field, const std::string& got,
                      const std::string& want) {
  return absl::FailedPreconditionError(
      absl::StrCat(source, ": ", field, " is ", got, ", the run has ", want));
}

std::string RopeScalingString(const model::TransformerConfig& t) {
  return t.rope_scaling.has_value() ? RopeScalingJson(t).dump() : "null";
}

// The checkpoint's config against the run's, field by field.
absl::Status CompareConfigs(const DrafterConfig& got, const DrafterConfig& want,
                            const std::string& source) {
  const model::TransformerConfig &g = got.target, &w = want.target;
  const std::pair<const char*, std::pair<int64_t, int64_t>> ints[] = {
      {"hidden_size", {g.hidden_size, w.hidden_size}},
      {"intermediate_size", {g.intermediate_size, w.intermediate_size}},
      {"num_attention_heads", {g.num_attention_heads, w.num_attention_heads}},
      {"num_key_value_heads", {g.num_key_value_heads, w.num_key_value_heads}},
      {"head_dim", {g.head_dim, w.head_dim}},
      {"vocab_size", {g.vocab_size, w.vocab_size}},
      {"num_target_layers", {g.num_hidden_layers, w.num_hidden_layers}},
      {"num_hidden_layers", {got.num_layers, want.num_layers}},
      {"block_size", {got.block_size, want.block_size}},
      {"dflash_config.mask_token_id", {got.mask_token_id, want.mask_token_id}},
  };
  for (const auto& [field, values] : ints) {
    if (values.first != values.second) {
      return Mismatch(source, field, absl::StrCat(values.first), absl::StrCat(values.second));
    }
  }
  if (g.rms_norm_eps != w.rms_norm_eps) {
    return Mismatch(source, "rms_norm_eps", absl::StrCat(g.rms_norm_eps),
                    absl::StrCat(w.rms_norm_eps));
  }
  if (g.rope_theta != w.rope_theta) {
    return Mismatch(source, "rope_theta", absl::StrCat(g.rope_theta), absl::StrCat(w.rope_theta));
  }
  if (RopeScalingString(g) != RopeScalingString(w)) {
    return Mismatch(source, "rope_scaling", RopeScalingString(g), RopeScalingString(w));
  }
  if (got.target_layer_ids != want.target_layer_ids) {
    return Mismatch(source, "dflash_config.target_layer_ids",
                    absl::StrCat("[", absl::StrJoin(got.target_layer_ids, ", "), "]"),
                    absl::StrCat("[", absl::StrJoin(want.target_layer_ids, ", "), "]"));
  }
  if (LayerTypes(got) != LayerTypes(want)) {
    return Mismatch(source, "layer_types",
                    absl::StrCat("[", absl::StrJoin(LayerTypes(got), ", "), "]"),
                    absl::StrCat("[", absl::StrJoin(LayerTypes(want), ", "), "]"));
  }
  if (!SlidingLayerIds(got).empty() && got.sliding_window != want.sliding_window) {
    return Mismatch(source, "sliding_window", absl::StrCat(got.sliding_window),
                    absl::StrCat(want.sliding_window));
  }
  const std::pair<const char*, std::pair<int64_t, int64_t>> dflash2[] = {
      {"conv_kernel_size", {got.conv_kernel_size, want.conv_kernel_size}},
      {"conv_group_size", {got.conv_group_size, want.conv_group_size}},
      {"selector_rank", {got.selector_rank, want.selector_rank}},
      {"selector_top_k", {got.selector_top_k, want.selector_top_k}},
  };
  for (const auto& [field, values] : dflash2) {
    if (values.first != values.second) {
      return Mismatch(source, field, absl::StrCat(values.first), absl::StrCat(values.second));
    }
  }
  const std::pair<const char*, std::pair<double, double>> scales[] = {
      {"output_multiplier", {got.output_multiplier, want.output_multiplier}},
      {"final_logit_softcapping", {got.final_logit_softcapping, want.final_logit_softcapping}},
      {"input_embedding_scale", {got.input_embedding_scale, want.input_embedding_scale}},
  };
  for (const auto& [field, values] : scales) {
    if (values.first != values.second) {
      return Mismatch(source, field, absl::StrCat(values.first), absl::StrCat(values.second));
    }
  }
  return absl::OkStatus();
}

// Where the checkpoint's tensors are listed, for errors about absent tensors.
std::string WeightsSource(const std::string& dir) {
  std::error_code ec;
  const fs::path single = fs::path(dir) / kWeightsName;
  return fs::exists(single, ec) ? single.string()
                                : (fs::path(dir) / "model.safetensors.index.json").string();
}

// Every expected tensor present, shaped and floating-point; nothing else.
absl::Status CheckTensors(const model::Checkpoint& ckpt, const std::vector<NamedParameter>& specs) {
  const std::string source = WeightsSource(ckpt.dir());
  std::set<std::string> expected;
  for (const NamedParameter& spec : specs) {
    expected.insert(spec.name);
    if (!ckpt.Has(spec.name)) {
      return absl::NotFoundError(absl::StrCat(source, ": missing tensor '", spec.name, "'"));
    }
    ASSIGN_OR_RETURN(model::TensorView view, ckpt.Get(spec.name));
    if (view.info->shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor '", spec.name,
                                                     "' has shape ", ShapeString(view.info->shape),
                                                     ", expected ", ShapeString(spec.shape)));
    }
    const model::DType dt = view.info->dtype;
    if (dt != model::DType::kF32 && dt != model::DType::kBF16 && dt != model::DType::kF16 &&
        dt != model::DType::kF64) {
      return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor '", spec.name,
                                                     "' has dtype ", model::DTypeName(dt),
                                                     ", expected a floating-point type"));
    }
  }
  for (const std::string& name : ckpt.TensorNames()) {
    if (expected.count(name) > 0) continue;
    ASSIGN_OR_RETURN(model::TensorView view, ckpt.Get(name));
    return absl::InvalidArgumentError(absl::StrCat(
        view.file, ": unexpected tensor '", name,
        "' (a drafter checkpoint holds only fc, hidden_norm, layers.*, norm and, for DFlash2, "
        "candidate_selector.*; no embed_tokens or lm_head)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DrafterConfigJson(const DrafterConfig& config, model::DType dtype) {
  const model::TransformerConfig& t = config.target;
  nlohmann::ordered_json j;
  j["architectures"] = {config.dflash2() ? kArchitecture2 : kArchitecture};
  j["model_type"] = "qwen3";  // the drafter's layers are Qwen3 layers (q_norm, k_norm), no biases
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["block_size"] = config.block_size;
  // dflash_config is what the reference inference package (DFlashDraftModel) reads first; the
  // top-level block_size stays for older readers.
  j["dflash_config"] = {{"block_size", config.block_size},
                        {"mask_token_id", config.mask_token_id},
                        {"target_layer_ids", config.target_layer_ids}};
  if (config.output_multiplier != 1.0) {
    j["dflash_config"]["output_multiplier"] = config.output_multiplier;
  }
  if (config.final_logit_softcapping > 0) {
    j["dflash_config"]["final_logit_softcapping"] = config.final_logit_softcapping;
  }
  if (config.input_embedding_scale != 1.0) {
    j["dflash_config"]["input_embedding_scale"] = config.input_embedding_scale;
  }
  if (config.dflash2()) {
    j["dflash_config"]["conv_kernel_size"] = config.conv_kernel_size;
    j["dflash_config"]["conv_group_size"] = config.conv_group_size;
    j["dflash_config"]["selector_rank"] = config.selector_rank;
    j["dflash_config"]["selector_top_k"] = config.selector_top_k;
  }
  j["head_dim"] = t.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = t.hidden_size;
  j["intermediate_size"] = t.intermediate_size;
  j["layer_types"] = LayerTypes(config);
  j["max_position_embeddings"] = t.max_position_embeddings;
  j["num_attention_heads"] = t.num_attention_heads;
  j["num_hidden_layers"] = config.num_layers;
  j["num_key_value_heads"] = t.num_key_value_heads;
  j["num_target_layers"] = t.num_hidden_layers;
  j["rms_norm_eps"] = t.rms_norm_eps;
  j["rope_scaling"] = RopeScalingJson(t);
  j["rope_theta"] = t.rope_theta;
  j["tie_word_embeddings"] = false;  // the drafter has neither embedding nor lm_head
  j["torch_dtype"] = dtype == model::DType::kF32 ? "float32" : "bfloat16";
  // transformers' Qwen3Config keeps sliding_window only with use_sliding_window (method.md §2.1).
  const bool windowed = !SlidingLayerIds(config).empty() && config.sliding_window > 0;
  if (windowed) j["sliding_window"] = config.sliding_window;
  j["use_sliding_window"] = windowed;
  j["vocab_size"] = t.vocab_size;
  return j.dump(2);
}

absl::Status ExportDrafter(const DrafterModel& model, const std::string& dir,
                           const ExportOptions& options) {
  if (options.dtype != model::DType::kBF16 && options.dtype != model::DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("drafter export dtype must be BF16 or F32, got ",
                                                   model::DTypeName(options.dtype)));
  }
  const fs::path target = fs::path(dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(target, ec) && !options.overwrite) {
    return absl::AlreadyExistsError(absl::StrCat(target.string(), " already exists"));
  }
  if (!target.parent_path().empty()) fs::create_directories(target.parent_path(), ec);
  std::string tmp = target.string() + ".tmp-XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr) return Errno(absl::StrCat("mkdtemp ", tmp));
  absl::Status s;
  try {
    s = WriteCheckpointFiles(model, tmp, options.dtype);
  } catch (const c10::Error& e) {
    s = absl::InternalError(
        absl::StrCat("converting drafter tensors: ", e.what_without_backtrace()));
  }
  if (s.ok()) s = Publish(tmp, target, options.overwrite);
  if (!s.ok()) RemoveTree(tmp);
  return Annotate(s, absl::StrCat("exporting the drafter to ", target.string()));
}

absl::StatusOr<DrafterConfig> ReadDrafterConfig(const std::string& dir) {
  ASSIGN_OR_RETURN(model::TransformerConfig t, model::LoadHfConfig(dir));
  const std::string source = (fs::path(dir) / kConfigName).string();
  bool drafter = false, dflash2 = false;
  for (const std::string& a : t.architectures) {
    drafter |= (a == kArchitecture);
    dflash2 |= (a == kArchitecture2);
  }
  if (!drafter && !dflash2) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": architectures must list ", kArchitecture, " or ", kArchitecture2));
  }
  if (!t.mask_token_id.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": dflash_config.mask_token_id: required"));
  }
  DrafterConfig c;
  c.num_layers = t.num_hidden_layers;
  c.block_size = t.block_size;
  c.mask_token_id = *t.mask_token_id;
  c.target_layer_ids = t.target_layer_ids.has_value()
                           ? *t.target_layer_ids
                           : model::DefaultTargetLayerIds(t.num_target_layers, t.num_hidden_layers);
  c.layer_types = t.layer_types;
  c.sliding_window = t.sliding_window;
  // The output head's scales and DFlash2's settings, as the config parser read them.
  c.output_multiplier = t.output_multiplier;
  c.final_logit_softcapping = t.final_logit_softcapping;
  c.input_embedding_scale = t.input_embedding_scale;
  c.conv_kernel_size = t.conv_kernel_size;
  c.conv_group_size = t.conv_group_size;
  c.selector_rank = t.selector_rank;
  c.selector_top_k = t.selector_top_k;
  c.target = std::move(t);
  c.target.num_hidden_layers = c.target.num_target_layers;
  c.target.architectures.clear();
  c.target.layer_types.clear();  // the drafter's, not the target's
  c.target.sliding_window = 0;
  RETURN_IF_ERROR(Annotate(ValidateDrafterConfig(c), source));
  return c;
}

absl::Status ImportDrafter(const std::string& dir, DrafterModel* model) {
  ASSIGN_OR_RETURN(DrafterConfig got, ReadDrafterConfig(dir));
  RETURN_IF_ERROR(CompareConfigs(got, model->config(), (fs::path(dir) / kConfigName).string()));
  ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt, model::Checkpoint::Open(dir));
  RETURN_IF_ERROR(CheckTensors(*ckpt, model->parameters()));
  try {
    at::NoGradGuard no_grad;
    for (const NamedParameter& p : model->parameters()) {
      ASSIGN_OR_RETURN(model::TensorView view, ckpt->Get(p.name));
      p.tensor.copy_(nn::ViewToTensor(view, p.tensor.scalar_type(), p.tensor.device()));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("loading the drafter from ", dir, ": ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace dflash::drafter

#include "common/run/resolve.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/run_fields.h"
#include "common/model/builtin_config.h"

namespace dflash::run {
namespace {

constexpr char kBuiltin[] = "builtin:";
constexpr int64_t kDefaultFeatures = 5;  // method.md §2: K = 5

}  // namespace

absl::StatusOr<model::TransformerConfig> RunTargetConfig(const config::RunSpec& spec) {
  const std::string& path = spec.target.path;
  absl::StatusOr<model::TransformerConfig> c =
      absl::StartsWith(path, kBuiltin)
          ? model::BuiltinTargetConfig(path.substr(sizeof(kBuiltin) - 1))
          : model::LoadHfConfig(path);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat("target.path: ", c.status().message()));
  }
  return c;
}

absl::Status CheckRunTargetShapes(const config::RunSpec& spec,
                                  const model::TransformerConfig& target) {
  if (spec.placement.target_parallel > 1) {
    absl::StatusOr<std::vector<int64_t>> ids = RunLayerIds(spec, target);
    if (!ids.ok()) return ids.status();
    const int64_t layers = *std::max_element(ids->begin(), ids->end()) + 1;
    if (absl::Status s = model::CheckTensorParallel(target, layers, spec.placement.target_parallel);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("placement.target_parallel: ", s.message()));
    }
  }
  if (spec.drafter.kind == "dflash2") {
    const config::Dflash2Settings two = config::ResolvedDflash2(spec.drafter);
    if (target.hidden_size % two.conv_group_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("drafter.conv_group_size: ", two.conv_group_size,
                       " does not divide the target's hidden size ", target.hidden_size));
    }
    if (two.selector_top_k > target.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("drafter.selector_top_k: ", two.selector_top_k,
                                                     " is above the target's vocabulary of ",
                                                     target.vocab_size, " tokens"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SlidingLayers> RunSlidingLayers(const config::RunSpec& spec) {
  SlidingLayers out;
  out.window = spec.drafter.sliding_window;
  if (spec.drafter.sliding_layers) {
    out.layers = *spec.drafter.sliding_layers;
    std::sort(out.layers.begin(), out.layers.end());
    return out;
  }
  if (spec.drafter.init_from.empty()) return out;
  absl::StatusOr<model::TransformerConfig> c = model::LoadHfConfig(spec.drafter.init_from);
  if (!c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter.sliding_layers: auto reads drafter.init_from: ", c.status().message()));
  }
  for (size_t i = 0; i < c->layer_types.size(); ++i) {
    if (c->layer_types[i] == "sliding_attention") out.layers.push_back(static_cast<int64_t>(i));
  }
  if (!out.layers.empty() && out.layers.back() >= spec.drafter.layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter.sliding_layers: auto takes drafter.init_from's, whose layer ", out.layers.back(),
        " is not among the run's ", spec.drafter.layers, " (drafter.layers)"));
  }
  // Without a sliding layer there is no window (the drafter echoes 0 then).
  out.window = out.layers.empty() ? 0 : (out.window > 0 ? out.window : c->sliding_window);
  return out;
}

absl::StatusOr<std::vector<int64_t>> RunLayerIds(const config::RunSpec& spec,
                                                 const model::TransformerConfig& target) {
  std::vector<int64_t> ids;
  if (spec.target.layer_ids) {
    ids = *spec.target.layer_ids;
  } else if (target.target_layer_ids) {
    ids = *target.target_layer_ids;
  } else {
    ids = model::DefaultTargetLayerIds(target.num_hidden_layers, kDefaultFeatures);
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= target.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("target.layer_ids: ", absl::StrJoin(ids, ","),
                                                     ": id ", id, " is outside the target's ",
                                                     target.num_hidden_layers, " layers"));
    }
  }
  if (ids.empty()) return absl::InvalidArgumentError("target.layer_ids: no layer");
  std::vector<int64_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target.layer_ids: ", spec.target.layer_ids ? "" : "auto gives ", absl::StrJoin(ids, ","),
        " for a target of ", target.num_hidden_layers, " layers: ids repeat; set distinct ids"));
  }
  return ids;
}

namespace {

// The run's tokenizer.json: data.tokenizer, auto: the target's (none for a built-in target).
std::string RunTokenizerJson(const config::RunSpec& spec) {
  if (spec.data.tokenizer != "auto") return spec.data.tokenizer;
  if (absl::StartsWith(spec.target.path, "builtin:")) return "";
  return (std::filesystem::path(spec.target.path) / "tokenizer.json").string();
}

}  // namespace

absl::StatusOr<model::MaskTokenChoice> RunMaskToken(const config::RunSpec& spec,
                                                    const model::TransformerConfig& target) {
  using model::kQwen3MaskTokenId;
  model::MaskTokenChoice c;
  if (spec.drafter.mask_token_id) {
    c = {*spec.drafter.mask_token_id, "", "drafter.mask_token_id"};
  } else if (target.mask_token_id) {  // a built-in target's, or the checkpoint's
    c = {*target.mask_token_id, "",
         absl::StartsWith(spec.target.path, "builtin:") ? "the built-in target's"
                                                        : "the target's config.json"};
  } else {
    const std::string tokenizer = RunTokenizerJson(spec);
    absl::StatusOr<model::MaskTokenChoice> found =
        tokenizer.empty() || absl::StartsWith(tokenizer, "builtin:")
            ? absl::NotFoundError("the target has no tokenizer.json")
            : model::MaskTokenFromTokenizer(tokenizer, target.vocab_size);
    if (found.ok()) {
      c = *std::move(found);
    } else if (found.status().code() != absl::StatusCode::kNotFound) {
      return absl::Status(found.status().code(),
                          absl::StrCat("drafter.mask_token_id: ", found.status().message()));
    } else if (target.model_type == "qwen3" && target.vocab_size > kQwen3MaskTokenId) {
      c = {kQwen3MaskTokenId, "", "Qwen3's mask token"};  // a config without its tokenizer
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "drafter.mask_token_id: auto found no mask token for the ", target.model_type,
          " target with ", target.vocab_size, " tokens: ", found.status().message(),
          "; set drafter.mask_token_id to an id the data never uses"));
    }
  }
  if (c.id >= target.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("drafter.mask_token_id: ", c.id,
                                                   " is not below the target's vocabulary (",
                                                   target.vocab_size, ")"));
  }
  return c;
}

absl::StatusOr<int64_t> RunMaskTokenId(const config::RunSpec& spec,
                                       const model::TransformerConfig& target) {
  absl::StatusOr<model::MaskTokenChoice> c = RunMaskToken(spec, target);
  if (!c.ok()) return c.status();
  return c->id;
}

std::string DescribeMaskToken(const model::MaskTokenChoice& c) {
  return c.token.empty() ? absl::StrCat(c.id, " (", c.rule, ")")
                         : absl::StrCat(c.id, " (", c.token, ": ", c.rule, ")");
}

std::vector<std::string> TargetEchoKeys(int64_t tp_rank) {
  return config::EchoedFields(config::kEchoTarget | (tp_rank == 0 ? config::kEchoTargetRank0 : 0));
}

std::vector<std::string> DrafterEchoKeys(bool has_gamma) {
  std::vector<std::string> keys =
      config::EchoedFields(config::kEchoDrafter | (has_gamma ? config::kEchoDrafterIfSet : 0));
  // Resolved at the start of the run, not run.yaml fields: the schedule's length and the step the
  // drafter resumes at.
  keys.push_back("optim.total_steps");
  keys.push_back("resume.step");
  return keys;
}

}  // namespace dflash::run

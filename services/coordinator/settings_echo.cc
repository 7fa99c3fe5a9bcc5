#include "services/coordinator/settings_echo.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/run_fields.h"
#include "common/run/resolve.h"

namespace dflash::coordinator {

absl::StatusOr<v1::ResolvedTarget> ResolveTargetSettings(const config::RunSpec& spec,
                                                         const model::TransformerConfig& target) {
  absl::StatusOr<std::vector<int64_t>> ids = run::RunLayerIds(spec, target);
  if (!ids.ok()) return ids.status();
  absl::StatusOr<model::MaskTokenChoice> mask = run::RunMaskToken(spec, target);
  if (!mask.ok()) return mask.status();
  // drafter.sliding_layers: auto reads drafter.init_from's config: refused here, not at the
  // drafter's first step.
  if (absl::StatusOr<run::SlidingLayers> sliding = run::RunSlidingLayers(spec); !sliding.ok()) {
    return sliding.status();
  }
  v1::ResolvedTarget r;
  for (int64_t id : *ids) r.add_target_layer_ids(id);
  r.set_mask_token_id(mask->id);
  r.set_mask_token(mask->token);
  r.set_mask_token_rule(mask->rule);
  return r;
}

std::string DescribeResolvedTarget(const v1::ResolvedTarget& r) {
  return absl::StrCat(
      "target layer ids ", absl::StrJoin(r.target_layer_ids(), ","), "; mask token id ",
      run::DescribeMaskToken({r.mask_token_id(), r.mask_token(), r.mask_token_rule()}));
}

std::map<std::string, std::string> ExpectedSettings(
    const config::RunSpec& spec, const std::vector<int64_t>& layer_ids, int64_t mask_token_id,
    const std::string& transport, int64_t total_steps, int64_t resume_step, int64_t num_pairs) {
  // Every echoed run.yaml field (the field table says which) as the workers write it, then what
  // the run resolves: auto values, defaults, the placement, and two values that are no fields.
  std::map<std::string, std::string> e;
  for (const config::RunField& f : config::RunFields()) {
    if (f.echo != config::kEchoNone) e[f.path()] = config::EchoValueText(f, spec);
  }
  e["target.layer_ids"] = absl::StrJoin(layer_ids, ",");
  e["drafter.mask_token_id"] = std::to_string(mask_token_id);
  e["optim.total_steps"] = std::to_string(total_steps);
  e["resume.step"] = std::to_string(resume_step);
  e["placement.pairs"] = std::to_string(num_pairs);
  e["placement.transport"] = transport;
  const std::optional<double> gamma =
      spec.loss.gamma ? spec.loss.gamma : config::DefaultGamma(spec.drafter.block_size);
  if (gamma) {
    e["loss.gamma"] = absl::StrCat(*gamma);
  } else {
    e.erase("loss.gamma");
  }
  const absl::StatusOr<run::SlidingLayers> sliding = run::RunSlidingLayers(spec);
  e["drafter.sliding_layers"] =
      sliding.ok() ? absl::StrJoin(sliding->layers, ",") : std::string(sliding.status().message());
  e["drafter.sliding_window"] = sliding.ok() ? std::to_string(sliding->window) : "?";
  // DFlash2's settings as the drafter built them (0 for a DFlash drafter).
  const config::Dflash2Settings two = config::ResolvedDflash2(spec.drafter);
  e["drafter.conv_kernel_size"] = std::to_string(two.conv_kernel_size);
  e["drafter.conv_group_size"] = std::to_string(two.conv_group_size);
  e["drafter.selector_rank"] = std::to_string(two.selector_rank);
  e["drafter.selector_top_k"] = std::to_string(two.selector_top_k);
  return e;
}

std::vector<std::string> RequiredEcho(bool drafter, int64_t tp_rank,
                                      const std::map<std::string, std::string>& expected) {
  return drafter ? run::DrafterEchoKeys(expected.count("loss.gamma") > 0)
                 : run::TargetEchoKeys(tp_rank);
}

absl::Status CheckEcho(const std::string& worker,
                       const std::map<std::string, std::string>& expected,
                       const std::map<std::string, std::string>& applied,
                       const std::vector<std::string>& required) {
  for (const std::string& key : required) {
    if (applied.count(key)) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("settings echo: ", key, ": worker ", worker,
                     " did not report the value it applies; the run is not started"));
  }
  for (const auto& [key, value] : applied) {
    auto it = expected.find(key);
    if (it == expected.end() || it->second == value) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "settings echo: ", key, ": worker ", worker, " would apply '", value,
        "' where the run's resolved config says '", it->second, "'; the run is not started"));
  }
  return absl::OkStatus();
}

}  // namespace dflash::coordinator

// A run's target as its workers will build it, resolved from run.yaml in one place: the target's
// config, its feature layer ids and the drafter's mask token (`auto` included), and the settings
// each worker echoes back (docs/run-spec.md#settings-echo). The coordinator (at submit, for the
// memory plan and when a run starts), the target worker and the drafter worker call these same
// functions on the same files, so every side agrees without talking to the others.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/model/hf_config.h"
#include "common/model/mask_token.h"

namespace dflash::run {

// The target config and feature layer ids the run's workers will build (run.yaml target.path,
// target.layer_ids; builtin:NAME or an HF checkpoint's config.json). Errors name the field.
absl::StatusOr<model::TransformerConfig> RunTargetConfig(const config::RunSpec& spec);
// INVALID_ARGUMENT naming target.layer_ids when an id is outside the target or, for `auto`, the
// resolved ids repeat (a target too shallow for the default rule).
absl::StatusOr<std::vector<int64_t>> RunLayerIds(const config::RunSpec& spec,
                                                 const model::TransformerConfig& target);
// What the target's shapes cannot take, refused by field before a run starts (at submit, and by
// `dflashctl plan --local`): placement.target_parallel not dividing the heads, experts or the
// layers up to the last feature layer (model::CheckTensorParallel); for drafter.kind dflash2,
// drafter.conv_group_size not dividing the hidden size and drafter.selector_top_k above the
// vocabulary (method.md §2.2). INVALID_ARGUMENT naming the field.
absl::Status CheckRunTargetShapes(const config::RunSpec& spec,
                                  const model::TransformerConfig& target);
// The mask token the drafter uses (drafter.mask_token_id): the run's, else the target's (a
// built-in target's or the checkpoint's config.json), else the rule of MaskTokenFromTokenizer
// (common/model/mask_token.h) over the run's tokenizer.json (data.tokenizer, auto: the target's),
// else 151669 for a Qwen3 target without tokenizer files whose vocabulary holds it.
// INVALID_ARGUMENT naming drafter.mask_token_id when no rule gives an id or the id is outside the
// target's vocabulary.
absl::StatusOr<model::MaskTokenChoice> RunMaskToken(const config::RunSpec& spec,
                                                    const model::TransformerConfig& target);
absl::StatusOr<int64_t> RunMaskTokenId(const config::RunSpec& spec,
                                       const model::TransformerConfig& target);
// The drafter's sliding-attention layers and their window (method.md §2.1): drafter.sliding_layers
// and drafter.sliding_window, or with `auto` those of drafter.init_from's config.json (none
// without init_from; a window of 0 there: causal layers without a window). INVALID_ARGUMENT
// naming the field when init_from's config cannot be read or its layers are not the run's.
struct SlidingLayers {
  std::vector<int64_t> layers;  // ascending
  int64_t window = 0;
};
absl::StatusOr<SlidingLayers> RunSlidingLayers(const config::RunSpec& spec);

// "3 (<repo_name>: the first special token ...)", for logs and status.
std::string DescribeMaskToken(const model::MaskTokenChoice& c);

// The settings echo: the run.yaml fields a worker reports back from what it built, the one table
// the coordinator checks against and both workers fill. A target echoes the loaded model's path,
// dtype and feature layers and its token budget; rank 0 of its group (the one holding the pair's
// channel) also the transport. A drafter echoes its model's target layers, shape, mask token and
// recompute mode, the anchor limit it enforces, its trainer's learning rate, schedule length and
// step, its communicator's size, its channel's transport, and loss.gamma when the run has one.
// The run.yaml fields among them are those the field table marks (common/config/run_fields.h).
std::vector<std::string> TargetEchoKeys(int64_t tp_rank);
std::vector<std::string> DrafterEchoKeys(bool has_gamma);

}  // namespace dflash::run

// The drafter checkpoint users serve (method.md §7): a directory with config.json (the target's
// Qwen3-style fields, architectures ["DFlashDraftModel"], num_hidden_layers = drafter layers,
// block_size, num_target_layers, dflash_config {mask_token_id, target_layer_ids}) and
// model.safetensors holding only the drafter's tensors (fc, hidden_norm, layers.i.*, norm; never
// embed_tokens or lm_head), loadable by SGLang (--speculative-algorithm DFLASH) and vLLM
// ("method": "dflash"). Import is the inverse, for drafter.init_from.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/drafter/drafter_model.h"
#include "common/model/safetensors.h"

namespace dflash::drafter {

struct ExportOptions {
  model::DType dtype = model::DType::kBF16;  // kBF16 (serving) or kF32 (bit-exact master weights)
  // Replace an existing directory. Without it an existing `dir` is ALREADY_EXISTS.
  bool overwrite = false;
};

// The config.json text of `config` whose weights are stored in `dtype`. ParseHfConfig reads it back
// with the same target dimensions, num_hidden_layers = config.num_layers, block_size,
// num_target_layers = config.target.num_hidden_layers, mask_token_id and target_layer_ids.
std::string DrafterConfigJson(const DrafterConfig& config, model::DType dtype);

// Writes <dir>/config.json and <dir>/model.safetensors. Everything is written into a temporary
// sibling directory (fsynced) that is then renamed to `dir`, so a crash never leaves a half-written
// checkpoint under `dir` (with overwrite, the old directory is renamed aside first and removed
// last: a crash in between leaves the new checkpoint complete and the old one under
// "<dir>.old-*").
absl::Status ExportDrafter(const DrafterModel& model, const std::string& dir,
                           const ExportOptions& options = {});

// <dir>/config.json as a DrafterConfig (target.num_hidden_layers = num_target_layers). A config
// without dflash_config.target_layer_ids gets DefaultTargetLayerIds(num_target_layers,
// num_hidden_layers), the rule of the reference inference code; one without mask_token_id is
// refused.
absl::StatusOr<DrafterConfig> ReadDrafterConfig(const std::string& dir);

// Loads the checkpoint at `dir` into `model`'s parameters (converted to the model's dtype and
// device; gradients untouched). Everything is checked before anything is copied:
//   - the config matches the model's (hidden_size, intermediate_size, num_attention_heads,
//     num_key_value_heads, head_dim, vocab_size, rms_norm_eps, rope_theta, rope_scaling,
//     num_target_layers, num_hidden_layers, block_size, mask_token_id, target_layer_ids);
//     FAILED_PRECONDITION "<dir>/config.json: hidden_size is 128, the run has 64";
//   - every expected tensor is present with its shape and a floating-point dtype, and there is no
//     other tensor; INVALID_ARGUMENT / NOT_FOUND naming the tensor and the file.
absl::Status ImportDrafter(const std::string& dir, DrafterModel* model);

}  // namespace dflash::drafter

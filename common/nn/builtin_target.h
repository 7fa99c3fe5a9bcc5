// run.yaml `target.path: builtin:NAME`: targets built in memory for the embedded CPU demo and
// tests. builtin:tiny-qwen3 is a Qwen3-shaped decoder (config::TinyQwen3) whose weights are drawn
// from a fixed seed with LibTorch's CPU generator, so every process (target and drafter workers)
// builds the same model without any file.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/hf_config.h"
#include "common/nn/target_model.h"

namespace dflash::nn {

// The config of a built-in target (name without "builtin:"); NOT_FOUND for an unknown name.
absl::StatusOr<model::TransformerConfig> BuiltinTargetConfig(const std::string& name);

// The built-in target with `options` (layer ids, dtype, device) applied.
absl::StatusOr<std::unique_ptr<TargetModel>> BuiltinTarget(const std::string& name,
                                                           const TargetModelOptions& options);

}  // namespace dflash::nn

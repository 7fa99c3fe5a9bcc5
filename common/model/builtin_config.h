// The configs of the built-in targets (run.yaml `target.path: builtin:NAME`), without LibTorch:
// the coordinator's memory planner reads them, the target workers build the models
// (common/nn/builtin_target.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/hf_config.h"

namespace dflash::model {

// The config of a built-in target (name without "builtin:"); NOT_FOUND for an unknown name.
absl::StatusOr<TransformerConfig> BuiltinTargetConfig(const std::string& name);

}  // namespace dflash::model

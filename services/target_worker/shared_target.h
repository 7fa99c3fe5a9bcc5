// The target worker's full target (every layer and the final norm), shared within the process by
// a run's training steps and the evaluator (evaluator.cc): a run with eval.every_steps > 0 loads
// its target full and registers it, so that evaluations during training decode with the same
// weights instead of loading a second copy. Entries are weak: a model lives as long as its users.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "common/config/run_spec.h"
#include "common/nn/target_model.h"

namespace dflash::worker {

// What identifies a loaded target: path, dtype, layer ids and device.
std::string TargetKey(const config::RunSpec& spec, c10::Device device);

// The registered full target of `key` if one is alive, else null.
std::shared_ptr<nn::TargetModel> FindSharedTarget(const std::string& key);
void ShareTarget(const std::string& key, const std::shared_ptr<nn::TargetModel>& model);

}  // namespace dflash::worker

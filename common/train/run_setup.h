// run.yaml -> the models a worker runs: the target (HF checkpoint directory or builtin:NAME) with
// the run's feature layers, and the drafter (method.md §2) shaped from the target and the run's
// drafter settings. Target and drafter workers call the same functions, so both sides agree on
// layer ids, shapes and the mask token without talking to each other; each worker's settings
// echo reads them back from what it built (services/coordinator/settings_echo.h).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "common/drafter/drafter_model.h"
#include "common/nn/target_model.h"
#include "common/run/resolve.h"

namespace dflash::train {

// The drafter config: the target's shape, drafter.layers/block_size, the layer ids and
// drafter.mask_token_id as common/run/resolve.h resolves them (the same the coordinator applies;
// an error naming the field when it finds none).
absl::StatusOr<drafter::DrafterConfig> RunDrafterConfig(const config::RunSpec& spec,
                                                        const model::TransformerConfig& target);

// target.dtype as a scalar type (INVALID_ARGUMENT naming the field).
absl::StatusOr<c10::ScalarType> RunTargetDtype(const config::RunSpec& spec);

// The target with the run's feature layers, on `device` (`full`: every layer and the final norm, to
// generate). With `embeddings_only`, only what the
// drafter borrows is needed (embed_tokens, lm_head): just layer 0 is loaded besides them.
// This process's shard of a tensor-parallel target (placement.target_parallel; TargetModelOptions'
// tp_* fields): rank `rank` of `world`, summing partial layer outputs with `all_reduce`.
struct TargetShard {
  int64_t rank = 0, world = 1;
  std::function<absl::Status(const at::Tensor&)> all_reduce;
};

absl::StatusOr<std::unique_ptr<nn::TargetModel>> LoadRunTarget(const config::RunSpec& spec,
                                                               c10::Device device,
                                                               bool embeddings_only = false,
                                                               bool full = false,
                                                               const TargetShard& shard = {});

// A freshly initialized drafter (seeded by the run's seed) on `device`, borrowing `target`'s
// embeddings and lm_head; fp32 master weights, compute in target.dtype.
absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> CreateRunDrafter(
    const config::RunSpec& spec, const nn::TargetModel& target, c10::Device device);

// target.dtype's spelling of a model dtype ("bfloat16", "float16", "float32"): what a worker
// echoes for the model it built.
std::string TargetDtypeName(c10::ScalarType dtype);

}  // namespace dflash::train

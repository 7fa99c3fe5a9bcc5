// Tensor parallelism of the target model, Megatron style: each of the
// `world` processes of a target group holds shard `rank` of every decoder layer and all of them
// run the same packed batch.
//   attention: q/k/v rows of heads [rank * Hq / world, ...) and of kv heads likewise (column
//              parallel), o_proj's matching columns (row parallel);
//   dense MLP: gate/up rows and down columns of intermediate [rank * I / world, ...);
//   MoE:       the same split inside every expert and the shared expert (router and shared-expert
//              gate replicated);
//   linear attention (hybrids): key and value heads split like attention heads, with their conv
//              channels, dt_bias and A_log; out_proj's matching columns.
// A row-parallel output is a partial sum: TargetModel sums it over the group (the all-reduce of
// TargetModelOptions) before the residual add, so every rank holds the same residual stream and the
// same features. Biases of row-parallel layers stay on rank 0 only. Embeddings, norms and lm_head
// are replicated.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/hf_config.h"
#include "common/nn/gated_delta.h"

namespace dflash::nn {

struct TargetLayerWeights;

// Which shapes allow it: model::CheckTensorParallel (hf_config.h).

// A failed all-reduce of a tensor-parallel forward or extend, thrown through the layers to
// TargetModel's public call, which returns its status.
struct TensorParallelError {
  absl::Status status;
};

// Replaces the fused layer `w` (target_model.h; loaded whole) by shard `rank` of `world`.
void ShardLayer(TargetLayerWeights& w, const model::TransformerConfig& c, int64_t rank,
                int64_t world);

// The linear-attention dimensions of one shard: heads divided by `world`.
GatedDeltaDims ShardDims(const GatedDeltaDims& d, int64_t world);

}  // namespace dflash::nn

// run.yaml `target.path: builtin:NAME`: targets built in memory for the embedded CPU demo, tests
// and benchmarks (qwen3-8b-random: Qwen3-8B's shape; qwen3.5-27b-random: Qwen3.5-27B's hybrid
// text backbone; random weights drawn on the target's device). builtin:tiny-qwen3 is a Qwen3-shaped
// decoder (config::TinyQwen3) whose weights are drawn from a fixed seed with LibTorch's CPU
// generator, so every process (target and drafter workers) builds the same model without any file.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/hf_config.h"
#include "common/nn/target_model.h"

namespace dflash::nn {

// Random Qwen3 weights under HF names (model.embed_tokens, lm_head, model.layers.i.* for i <
// num_layers, model.norm), drawn in that fixed order from `normal` (standard normal samples of a
// shape): embeddings N(0, 1), lm_head N(0, 1) / lm_head_divisor, other matrices N(0, 1/in) so that
// activations keep unit scale; norms are ones with `ones_options`. The built-in targets, the
// benchmarks and the tests build their random targets with it.
std::map<std::string, at::Tensor> RandomQwen3Weights(
    const model::TransformerConfig& config, int64_t num_layers,
    const std::function<at::Tensor(at::IntArrayRef)>& normal, const at::TensorOptions& ones_options,
    double lm_head_divisor);

// Random weights of a Qwen3.5 text backbone (hybrid: gated delta-rule and gated-attention layers)
// under HF names for layers 0..num_layers-1, drawn with `options` (dtype, device) from that
// device's default generator: matrices N(0, 1/in), embeddings N(0, 1), zero-centered norms 0
// (scale 1), the delta rule's norm 1, decays A = exp(A_log) in [0.05, 2.7], convolution
// N(0, 1/kernel). builtin:qwen3.5-27b-random and the benchmarks draw their hybrid targets with it.
std::map<std::string, at::Tensor> RandomHybridWeights(const model::TransformerConfig& config,
                                                      int64_t num_layers,
                                                      const at::TensorOptions& options);

// The config of a built-in target (name without "builtin:"); NOT_FOUND for an unknown name.
absl::StatusOr<model::TransformerConfig> BuiltinTargetConfig(const std::string& name);

// The built-in target with `options` (layer ids, dtype, device) applied.
absl::StatusOr<std::unique_ptr<TargetModel>> BuiltinTarget(const std::string& name,
                                                           const TargetModelOptions& options);

}  // namespace dflash::nn

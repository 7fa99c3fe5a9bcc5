// The target model as a feature extractor (method.md §2): an inference-only Qwen3-dense / Llama-3
// decoder that runs a packed batch of documents and returns the residual stream after K chosen
// decoder layers, concatenated per token: features [T, K*H]. "Layer id i" is the output of
// decoder layer i (HF hidden_states[i+1], before the final norm); layers after the largest id are
// neither loaded nor run. Also holds the embedding and lm_head that the drafter borrows, frozen.
//
// LibTorch is a PRIVATE dependency of dflash_nn: a target that includes this header links
// ${TORCH_LIBRARIES} itself and must not also include generated protobuf headers (LibTorch's
// include directory ships an older google/protobuf).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/hf_config.h"
#include "common/nn/attention.h"
#include "common/nn/layers.h"

namespace dflash::nn {

class WeightSource;

struct TargetModelOptions {
  // Decoder layers whose outputs form the features, in feature order; each in [0, L). Empty:
  // model::DefaultTargetLayerIds(L, num_features).
  std::vector<int64_t> layer_ids;
  int64_t num_features = 5;                           // K, used only when layer_ids is empty
  c10::ScalarType dtype = c10::ScalarType::BFloat16;  // weights and activations
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

// One decoder layer, with q/k/v and gate/up fused into single GEMMs at load time.
struct TargetLayerWeights {
  at::Tensor input_norm;    // [H]
  at::Tensor qkv;           // [(Hq + 2*Hkv) * D, H]: q_proj, k_proj, v_proj rows
  at::Tensor qkv_bias;      // [(Hq + 2*Hkv) * D] when attention_bias, else undefined
  at::Tensor q_norm;        // [D] when qk_norm (Qwen3), else undefined
  at::Tensor k_norm;        // [D]
  at::Tensor o_proj;        // [H, Hq * D]
  at::Tensor o_bias;        // [H] when attention_bias
  at::Tensor post_norm;     // [H]
  at::Tensor gate_up;       // [2 * I, H]: gate_proj rows, then up_proj rows
  at::Tensor gate_up_bias;  // [2 * I] when mlp_bias
  at::Tensor down;          // [H, I]
  at::Tensor down_bias;     // [H] when mlp_bias
};

class TargetModel {
 public:
  // Reads <dir>/config.json and the safetensors weights (HF names: model.embed_tokens.weight,
  // model.layers.{i}.*, model.norm.weight, lm_head.weight unless tied). Every tensor of the full
  // model is checked for presence and shape, even those of layers that are not loaded.
  static absl::StatusOr<std::unique_ptr<TargetModel>> Load(const std::string& dir,
                                                           const TargetModelOptions& options);
  // The same model from tensors already in memory, keyed and shaped as in the checkpoint (HF
  // names), converted to options.dtype and options.device (not copied when already there; q/k/v
  // and gate/up are fused into new tensors). Only the tensors that Forward uses must be present:
  // embed_tokens, lm_head unless tied, and layers 0..max(layer ids). For benchmarks and tests
  // with random weights; errors name the missing or misshapen tensor.
  static absl::StatusOr<std::unique_ptr<TargetModel>> FromTensors(
      const model::TransformerConfig& config, const std::map<std::string, at::Tensor>& tensors,
      const TargetModelOptions& options);

  // Runs the packed batch and writes features into `features` [T, K*H] (model dtype and device;
  // its contents are replaced). input_ids [T] int64 in [0, V); positions [T] int64 (restarting at
  // 0 in each document); cu_seqlens [b+1] int32 from 0 to T. Inputs may live on any device.
  absl::Status Forward(const at::Tensor& input_ids, const at::Tensor& positions,
                       const at::Tensor& cu_seqlens, const at::Tensor& features) const;
  // The same into a new tensor.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input_ids, const at::Tensor& positions,
                                     const at::Tensor& cu_seqlens) const;

  const model::TransformerConfig& config() const { return config_; }
  const std::vector<int64_t>& layer_ids() const { return layer_ids_; }
  int64_t feature_dim() const {
    return static_cast<int64_t>(layer_ids_.size()) * config_.hidden_size;
  }
  c10::ScalarType dtype() const { return dtype_; }
  c10::Device device() const { return device_; }
  // [V, H]. lm_head is the same tensor as embed_tokens when the checkpoint ties them.
  const at::Tensor& embed_tokens() const { return embed_tokens_; }
  const at::Tensor& lm_head() const { return lm_head_; }

 private:
  TargetModel(model::TransformerConfig config, std::vector<int64_t> layer_ids,
              c10::ScalarType dtype, c10::Device device);
  // Checks the config and options, then the model without weights (INVALID_ARGUMENT or
  // UNIMPLEMENTED naming the problem).
  static absl::StatusOr<std::unique_ptr<TargetModel>> Create(model::TransformerConfig config,
                                                             const TargetModelOptions& options);
  absl::Status LoadWeights(const WeightSource& source);
  // Validates the inputs and reads the document offsets (INVALID_ARGUMENT naming the input).
  absl::StatusOr<VarlenDocs> CheckInputs(const at::Tensor& input_ids, const at::Tensor& positions,
                                         const at::Tensor& cu_seqlens,
                                         const at::Tensor& features) const;
  void RunLayers(const at::Tensor& input_ids, const at::Tensor& positions, const VarlenDocs& docs,
                 const at::Tensor& features) const;
  // x [T, H] -> [T, H], the output of decoder layer `layer`.
  at::Tensor RunLayer(const TargetLayerWeights& w, const at::Tensor& x, const RopeTables& rope,
                      const VarlenDocs& docs) const;

  model::TransformerConfig config_;
  std::vector<int64_t> layer_ids_;
  std::vector<std::vector<int64_t>> slots_of_layer_;  // layer -> feature slots it fills
  c10::ScalarType dtype_;
  c10::Device device_;
  at::Tensor embed_tokens_;
  at::Tensor lm_head_;
  at::Tensor inv_freq_;                     // [D/2] fp32 on device_
  std::vector<TargetLayerWeights> layers_;  // layers 0..max(layer_ids)
};

}  // namespace dflash::nn

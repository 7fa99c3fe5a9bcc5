// The target model as a feature extractor (method.md §2): an inference-only Qwen3-dense / Llama-3
// decoder that runs a packed batch of documents and returns the residual stream after K chosen
// decoder layers, concatenated per token: features [T, K*H]. "Layer id i" is the output of
// decoder layer i (HF hidden_states[i+1], before the final norm); layers after the largest id are
// neither loaded nor run, unless the model is loaded `full` to generate with a KV cache (Extend,
// Logits). Also holds the embedding and lm_head that the drafter borrows, frozen.
//
// LibTorch is a PRIVATE dependency of dflash_nn: a target that includes this header links
// ${TORCH_LIBRARIES} itself and must not also include generated protobuf headers (LibTorch's
// include directory ships an older google/protobuf).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/hf_config.h"
#include "common/nn/attention.h"
#include "common/nn/gated_delta.h"
#include "common/nn/layers.h"
#include "common/nn/moe.h"

namespace dflash::nn {

class WeightSource;

struct TargetModelOptions {
  // Decoder layers whose outputs form the features, in feature order; each in [0, L). Empty:
  // model::DefaultTargetLayerIds(L, num_features).
  std::vector<int64_t> layer_ids;
  int64_t num_features = 5;                           // K, used only when layer_ids is empty
  c10::ScalarType dtype = c10::ScalarType::BFloat16;  // weights and activations
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // Also load every decoder layer after the last feature layer and the final norm, so that the
  // model can generate (Extend, Logits). Forward still stops at the last feature layer.
  bool full = false;
  // Tensor parallelism (tensor_parallel.h): this process holds shard `tp_rank` of `tp_world` of
  // every layer; `tp_all_reduce` sums a contiguous tensor of the model's dtype and device over the
  // group in place, bit-identically on every rank (a transport::Communicator). With `full`, the
  // ranks generate together: each holds its heads' share of the KV cache and every rank makes the
  // same Extend calls in the same order (their all-reduces pair up), getting the same rows.
  int64_t tp_rank = 0, tp_world = 1;
  std::function<absl::Status(const at::Tensor&)> tp_all_reduce;
};

class TargetModel;

// The keys and values of every decoder layer for `sequences` sequences of up to `capacity`
// positions each (per layer [S, capacity, Hkv, D] in the model's dtype and device), and how many
// positions each sequence holds. Filled by TargetModel::Extend; not thread-safe.
class KvCache {
 public:
  // FAILED_PRECONDITION unless the model was loaded with options.full.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const TargetModel& model,
                                                         int64_t sequences, int64_t capacity);
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t length(int64_t sequence) const { return lengths_.at(sequence); }
  // Forgets the positions of `sequence` from `length` on (a verification's rejected tokens).
  // INVALID_ARGUMENT when length is negative or above the current length; with a hybrid target's
  // recurrent states only to 0 (a new sequence) or the current length: FAILED_PRECONDITION
  // otherwise (a recurrent state cannot be rolled back).
  absl::Status Truncate(int64_t sequence, int64_t length);
  // Hybrid targets: whether the cache holds recurrent states (linear-attention layers).
  bool has_recurrent_state() const;
  // Copies the recurrent states and lengths of `sequences` (before a verification), so that
  // RestoreStates can take a sequence back to them: its rejected tokens then leave no trace, and
  // the kept ones are extended again (speculative decoding with a hybrid target).
  void SaveStates(const std::vector<int64_t>& sequences);
  // `sequence`'s recurrent states and length as SaveStates copied them. FAILED_PRECONDITION when
  // they were not saved.
  absl::Status RestoreStates(int64_t sequence);

 private:
  friend class TargetModel;
  KvCache() = default;
  int64_t capacity_ = 0;
  // Per layer [S, Hkv, capacity, D] (head-major); undefined for a linear-attention layer.
  std::vector<at::Tensor> k_, v_;
  // Per linear-attention layer of a hybrid target (gated_delta.h GatedDeltaNetExtend): each
  // sequence's last conv rows [S, K-1, conv_dim] and recurrent state [S, Hv, dk, dv] (fp32);
  // undefined for an attention layer.
  std::vector<at::Tensor> conv_, state_;
  std::vector<int64_t> lengths_;
  // SaveStates: per linear-attention layer the saved rows (in the order of saved_rows_), and each
  // saved sequence's row and length.
  std::vector<at::Tensor> saved_conv_, saved_state_;
  std::map<int64_t, std::pair<int64_t, int64_t>> saved_rows_;  // sequence -> (row, length)
};

// What TargetModel::Extend computed for the N new tokens, in request order.
struct ExtendOutput {
  at::Tensor hidden;    // [N, H]: the last layer's output after the final norm
  at::Tensor features;  // [N, K*H]: the feature layers, as Forward; undefined unless asked
};

// One decoder layer, with q/k/v and gate/up fused into single GEMMs at load time. Norm weights of
// zero-centered models (config.zero_centered_norm) are held as (1 + weight) in fp32.
struct TargetLayerWeights {
  at::Tensor input_norm;  // [H]
  // [(Hq + 2*Hkv) * D, H]: q_proj, k_proj, v_proj rows. With config.attn_output_gate q_proj has
  // 2 * Hq * D rows: per head D query rows, then D rows of the output gate.
  at::Tensor qkv;
  at::Tensor qkv_bias;       // [(Hq + 2*Hkv) * D] when attention_bias, else undefined
  at::Tensor q_norm;         // [D] when qk_norm (Qwen3), else undefined
  at::Tensor k_norm;         // [D]
  at::Tensor o_proj;         // [H, Hq * D]
  at::Tensor o_bias;         // [H] when attention_bias
  at::Tensor post_norm;      // [H]
  at::Tensor gate_up;        // [2 * I, H]: gate_proj rows, then up_proj rows
  at::Tensor gate_up_bias;   // [2 * I] when mlp_bias
  at::Tensor down;           // [H, I]
  at::Tensor down_bias;      // [H] when mlp_bias
  MoeWeights moe;            // a Qwen3-MoE sparse layer: instead of gate_up and down
  GatedDeltaWeights linear;  // a linear-attention layer (hybrids): instead of qkv, norms, o_proj
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
  // embed_tokens, lm_head unless tied, and layers 0..max(layer ids); with options.full every
  // layer and model.norm. For benchmarks and tests
  // with random weights; errors name the missing or misshapen tensor.
  static absl::StatusOr<std::unique_ptr<TargetModel>> FromTensors(
      const model::TransformerConfig& config, const std::map<std::string, at::Tensor>& tensors,
      const TargetModelOptions& options);
  // The same, taking the tensors: each layer's q/k/v and gate/up are freed once fused, so the
  // load holds one layer's fused copies at a time beside the weights (as Load does), not every
  // layer's.
  static absl::StatusOr<std::unique_ptr<TargetModel>> FromTensors(
      const model::TransformerConfig& config, std::map<std::string, at::Tensor>&& tensors,
      const TargetModelOptions& options);

  // Runs the packed batch and writes features into `features` [T, K*H] (model dtype and device;
  // its contents are replaced). Tensor parallel: every rank of the group calls it with the same
  // batch and gets the same features; a failed all-reduce ends it with that error. input_ids [T]
  // int64 in [0, V); positions [T] int64 (restarting at 0 in each document); cu_seqlens [b+1] int32
  // from 0 to T. Inputs may live on any device.
  absl::Status Forward(const at::Tensor& input_ids, const at::Tensor& positions,
                       const at::Tensor& cu_seqlens, const at::Tensor& features) const;
  // The same into a new tensor.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input_ids, const at::Tensor& positions,
                                     const at::Tensor& cu_seqlens) const;

  // Generation (options.full only): runs tokens[i] as the next tokens of sequence sequences[i] of
  // `cache` (positions continue from the sequence's cache length; sequences distinct), appends
  // their keys and values to the cache and returns the rows of every new token, packed in order.
  // INVALID_ARGUMENT naming the sequence when it is out of range, listed twice, empty, beyond the
  // cache's capacity or holding a token outside the vocabulary. One call is one batched forward.
  absl::StatusOr<ExtendOutput> Extend(const std::vector<int64_t>& sequences,
                                      const std::vector<std::vector<int64_t>>& tokens,
                                      KvCache* cache, bool with_features) const;
  // lm_head(hidden): [N, V] fp32 logits of Extend's hidden rows (options.full only).
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& hidden) const;
  // The same model, its weights shared (not copied), summing its row-parallel outputs with
  // `all_reduce` instead: a tensor-parallel shard that training and decoding use at once, each
  // over its own group (two users of one group would interleave their all-reduces).
  std::unique_ptr<TargetModel> WithAllReduce(
      std::function<absl::Status(const at::Tensor&)> all_reduce) const;
  // This process's shard of a tensor-parallel target: rank and group size (0 and 1 when whole).
  int64_t tp_rank() const { return tp_rank_; }
  int64_t tp_world() const { return tp_world_; }
  bool full() const { return full_; }
  // Whether decoder layer l is a gated delta-rule (linear-attention) layer (hybrid targets).
  bool linear_layer(int64_t l) const {
    return l < static_cast<int64_t>(layers_.size()) &&
           layers_[static_cast<size_t>(l)].linear.defined();
  }
  // A layer's attention inputs: q [T, Hq, D], k and v [T, Hkv, D], normed and rotated; with
  // config.attn_output_gate also the output gate [T, Hq * D] (before its sigmoid).
  struct Qkv {
    at::Tensor q, k, v, gate;
  };

  const model::TransformerConfig& config() const { return config_; }
  const std::vector<int64_t>& layer_ids() const { return layer_ids_; }
  int64_t feature_dim() const {
    return static_cast<int64_t>(layer_ids_.size()) * config_.hidden_size;
  }
  c10::ScalarType dtype() const { return dtype_; }
  c10::Device device() const { return device_; }
  // The kernels the forward runs where it has a choice, for the run's start event: "attention:
  // flash varlen" (attention.h VarlenAttentionKernel), and for a hybrid target its linear
  // attention layers' gated delta rule ("fused scan kernels" on CUDA, else "reference"), then
  // the MLPs' activation ("mlp activation: fused swiglu" on CUDA, else "silu and mul (ATen)").
  std::string Kernels() const;
  // Where the weights came from: the directory Load read, or what the caller set (a built-in
  // target's "builtin:NAME"); "" for tensors handed in. What a worker echoes as target.path.
  const std::string& source() const { return source_; }
  void set_source(std::string source) { source_ = std::move(source); }
  // [V, H]. lm_head is the same tensor as embed_tokens when the checkpoint ties them.
  const at::Tensor& embed_tokens() const { return embed_tokens_; }
  const at::Tensor& lm_head() const { return lm_head_; }

 private:
  TargetModel(model::TransformerConfig config, std::vector<int64_t> layer_ids,
              const TargetModelOptions& options);
  TargetModel(const TargetModel&) = default;  // WithAllReduce
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
  // HF: head_dim ** -0.5.
  double AttentionScale() const;
  // The model's RMSNorm: RmsNorm, or RmsNormFp32Scale for zero-centered models.
  at::Tensor Norm(const at::Tensor& x, const at::Tensor& weight) const;
  Qkv Project(const TargetLayerWeights& w, const at::Tensor& x, const RopeTables& rope) const;
  // The rest of the layer after attention: o_proj, residual, MLP.
  at::Tensor Finish(const TargetLayerWeights& w, const at::Tensor& x, const at::Tensor& attn) const;
  // y [T, H] -> y + MLP(post_norm(y)).
  at::Tensor Mlp(const TargetLayerWeights& w, const at::Tensor& y) const;
  // A row-parallel output summed over the tensor-parallel group (in place; nothing when alone).
  // Throws TensorParallelError (target_model.cc) when the all-reduce fails.
  void AllReduce(const at::Tensor& partial) const;
  absl::Status CheckExtend(const std::vector<int64_t>& sequences,
                           const std::vector<std::vector<int64_t>>& tokens,
                           const KvCache& cache) const;

  model::TransformerConfig config_;
  std::vector<int64_t> layer_ids_;
  std::vector<std::vector<int64_t>> slots_of_layer_;  // layer -> feature slots it fills
  c10::ScalarType dtype_;
  std::string source_;
  c10::Device device_;
  at::Tensor embed_tokens_;
  at::Tensor lm_head_;
  at::Tensor inv_freq_;                     // [D/2] fp32 on device_
  std::vector<TargetLayerWeights> layers_;  // layers 0..max(layer_ids); all with options.full
  at::Tensor final_norm_;  // [H] with options.full, else undefined; 1 + weight when zero-centered
  bool full_ = false;
  int64_t tp_rank_ = 0, tp_world_ = 1;
  std::function<absl::Status(const at::Tensor&)> tp_all_reduce_;
};

}  // namespace dflash::nn

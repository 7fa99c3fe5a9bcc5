// config.json of Hugging Face decoder-only checkpoints that dflash runs as targets (Qwen3 dense,
// Llama-3) and writes for drafters (DFlashDraftModel, method.md §7). Parsed strictly: required
// fields present, types and ranges checked, errors name the file and the field. Keys dflash does
// not use are ignored (HF configs carry many); a JSON null counts as absent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dflash::model {

// method.md §3.2: Qwen3's tokenizer has no mask token; drafters for it use this id.
inline constexpr int64_t kQwen3MaskTokenId = 151669;

// rope_scaling of type "llama3" (Llama-3.1+); other types are refused by name.
struct RopeScaling {
  std::string rope_type;  // "llama3"
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct TransformerConfig {
  // "qwen3" | "qwen3_moe" | "llama" | "qwen3_next" | "qwen3_5" | "qwen3_5_text" | "qwen3_5_moe" |
  // "qwen3_5_moe_text" ("qwen3" for DFlash drafters). The multimodal qwen3_5 and qwen3_5_moe
  // configs are read from their text_config.
  std::string model_type;
  std::vector<std::string> architectures;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads when absent
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads when absent
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;     // per-head RMSNorm on q and k: true for Qwen3
  std::string torch_dtype;  // as written ("bfloat16", "float32", ...); may be empty
  // Mixture of experts (model_type qwen3_moe): a layer is sparse when num_experts > 0, it is not
  // in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0 (IsMoeLayer); other layers
  // have a dense MLP of intermediate_size. Router: softmax over experts in fp32, the top
  // num_experts_per_tok, renormalized to sum 1 when norm_topk_prob.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = false;  // transformers' Qwen3MoeConfig default
  std::vector<int64_t> mlp_only_layers;
  // A shared expert beside the routed ones (Qwen3-Next, Qwen3.5-MoE): a SwiGLU MLP of this width
  // on every token of a sparse layer, scaled by sigmoid(shared_expert_gate x). 0: none.
  int64_t shared_expert_intermediate_size = 0;
  // Hybrid linear-attention models (qwen3_next, qwen3_5, qwen3_5_moe and their *_text forms):
  // layer_types[i] is "linear_attention" (a gated delta-rule layer) or "full_attention"; empty
  // means every layer is full attention. Their full-attention layers gate their output per head
  // (q_proj emits [query, gate] per head) and rotate only the first head_dim *
  // partial_rotary_factor dimensions; every RMSNorm except the delta rule's gated one scales by
  // (1 + weight) computed in fp32 (zero_centered_norm).
  std::vector<std::string> layer_types;
  bool attn_output_gate = false;
  bool zero_centered_norm = false;
  double partial_rotary_factor = 1.0;
  int64_t linear_conv_kernel_dim = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  // qwen3_next stores a delta-rule layer's input projections fused and grouped per key head
  // (in_proj_qkvz, in_proj_ba); Qwen3.5 as four matrices (in_proj_qkv, in_proj_z, in_proj_b,
  // in_proj_a).
  bool fused_linear_projections = false;
  // Where the decoder's tensors live: "model." ("model.embed_tokens.weight", "model.layers.0...");
  // "model.language_model." for the text backbone of a multimodal checkpoint (qwen3_5,
  // qwen3_5_moe), whose vision tower dflash does not load. lm_head.weight is always top-level.
  std::string weight_prefix = "model.";
  // DFlash drafter fields (DFlashDraftModel): absent for targets.
  int64_t block_size = 0;
  int64_t num_target_layers = 0;
  std::optional<int64_t> mask_token_id;
  std::optional<std::vector<int64_t>> target_layer_ids;
  // A drafter's sliding layers' window (layer_types above holds full_attention and
  // sliding_attention for a drafter): sliding_window when use_sliding_window, else 0.
  int64_t sliding_window = 0;
  // The drafter's output head and slot embeddings (DFlash and DFlash2; docs/method.md §2.2):
  // logits times output_multiplier, soft-capped by final_logit_softcapping (0: off), slot
  // embeddings times input_embedding_scale.
  double output_multiplier = 1.0, final_logit_softcapping = 0.0, input_embedding_scale = 1.0;
  // DFlash2DraftModel's convolution and candidate selector; 0 for a DFlash drafter.
  int64_t conv_kernel_size = 0, conv_group_size = 0, selector_rank = 0, selector_top_k = 0;
};

// The model types dflash runs as targets, in the order errors list them.
const std::vector<std::string>& TargetModelTypes();

// Whether decoder layer `layer` has a mixture-of-experts MLP (see num_experts above).
bool IsMoeLayer(const TransformerConfig& c, int64_t layer);
// Whether decoder layer `layer` is a gated delta-rule (linear attention) layer.
bool IsLinearAttentionLayer(const TransformerConfig& c, int64_t layer);
bool IsHybrid(const TransformerConfig& c);  // any linear-attention layer

// Tensor parallelism over `world` processes (common/nn/tensor_parallel.h): OK when `world` divides
// every split dimension (attention and kv heads, intermediate sizes, linear-attention heads) of
// the layers [0, num_layers) of `c`; INVALID_ARGUMENT naming the config field otherwise (and for
// world < 1).
absl::Status CheckTensorParallel(const TransformerConfig& c, int64_t num_layers, int64_t world);
// The dimensions of each head that RoPE rotates: int(head_dim * partial_rotary_factor), as HF.
int64_t RotaryDim(const TransformerConfig& c);

// Parses config.json text; `source` names the file in errors.
absl::StatusOr<TransformerConfig> ParseHfConfig(const std::string& json_text,
                                                const std::string& source);
// Reads <dir>/config.json.
absl::StatusOr<TransformerConfig> LoadHfConfig(const std::string& dir);

// method.md §2: round_half_even(1 + i*(L-4)/(K-1)) for i in 0..K-1; for K == 1: L / 2.
// Empty when L or K is not positive. For L < 5 ids may repeat or fall outside 0..L-1; callers
// validate.
std::vector<int64_t> DefaultTargetLayerIds(int64_t num_target_layers, int64_t k);

}  // namespace dflash::model

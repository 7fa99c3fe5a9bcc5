// The DFlash drafter (method.md §2) and its training loss (§3), trainable in LibTorch: parameters
// are leaf tensors with requires_grad, the forward is plain ATen ops (plus the attention behind
// DrafterAttention and the fused lm_head + cross entropy of weighted_ce.h), so that backward() on
// the loss numerator fills every parameter's grad (and the features' grad when they require it).
// Never run it under c10::InferenceMode.
//
// Shapes (one packed batch): T packed positions, n anchor blocks of B slots, Q = n*B query rows,
// K target layers, H hidden size, V vocabulary.
//
// LibTorch is a PRIVATE dependency of dflash_drafter: a target that includes this header links
// ${TORCH_LIBRARIES} itself and must not also include generated protobuf headers.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/drafter/drafter_attention.h"
#include "common/model/hf_config.h"

namespace dflash::drafter {

using model::kQwen3MaskTokenId;

// method.md §3.6: expected acceptance length 1 + sum_k prod_{i<=k} acc_i over slots k = 1..B-1,
// acc_i = slot_correct[i] / slot_total[i] (0 where slot_total[i] is 0). Counts summed over
// micro-batches and ranks; slot 0 is ignored.
double ExpectedAcceptanceLength(const std::vector<int64_t>& slot_correct,
                                const std::vector<int64_t>& slot_total);

struct DrafterConfig {
  // The target's config (method.md §2: hidden size, heads, kv heads, head dim, intermediate size,
  // rms eps, rope settings and vocabulary are copied from it). target.num_hidden_layers is the
  // TARGET's depth (num_target_layers in the exported config). The drafter's layers are Qwen3
  // layers (q_norm and k_norm always) without biases (method.md §7 lists none), whatever the
  // target's qk_norm / attention_bias / mlp_bias say.
  model::TransformerConfig target;
  int64_t num_layers = 5;   // L_d, drafter decoder layers
  int64_t block_size = 16;  // B
  int64_t mask_token_id = kQwen3MaskTokenId;
  std::vector<int64_t> target_layer_ids;  // K ids in [0, target.num_hidden_layers), feature order
  // Per decoder layer, as the serving format writes them (method.md §2.1): "full_attention" or
  // "sliding_attention"; empty: every layer full. A sliding layer's block is causal (slot k sees
  // slots k' <= k) and, with sliding_window > 0, each slot sees only the rows less than
  // sliding_window positions before its own.
  std::vector<std::string> layer_types;
  int64_t sliding_window = 0;  // 0: sliding layers without a window (causal only)
  // The output head (both kinds, as the serving format's compute_logits): logits times
  // output_multiplier, then soft-capped to c * tanh(logits / c) with c = final_logit_softcapping
  // when it is above 0; noise (slot) embeddings times input_embedding_scale.
  double output_multiplier = 1.0, final_logit_softcapping = 0.0, input_embedding_scale = 1.0;
  // DFlash2 (docs/method.md §2.2; the serving format's DFlash2DraftModel): conv_kernel_size > 0
  // puts a grouped dynamic causal convolution over each block's slots around every layer's
  // attention and MLP (channels in groups of conv_group_size share a kernel), and a candidate
  // selector of rank selector_rank reranks the output head's top selector_top_k tokens of each
  // slot given the slot before it.
  int64_t conv_kernel_size = 0, conv_group_size = 0;
  int64_t selector_rank = 0, selector_top_k = 0;

  bool dflash2() const { return conv_kernel_size > 0; }

  bool sliding(int64_t layer) const {
    return layer < static_cast<int64_t>(layer_types.size()) &&
           layer_types[static_cast<size_t>(layer)] == "sliding_attention";
  }
  int64_t num_features() const { return static_cast<int64_t>(target_layer_ids.size()); }
  int64_t feature_dim() const { return num_features() * target.hidden_size; }  // K*H
};

// Every layer's type: config.layer_types, or full_attention for each layer when it is empty.
std::vector<std::string> LayerTypes(const DrafterConfig& config);
// The sliding-attention layers' indices, ascending (empty: every layer full).
std::vector<int64_t> SlidingLayerIds(const DrafterConfig& config);
// Makes layers `ids` (each in [0, num_layers)) sliding-attention layers of window `window`, the
// others full; no ids: every layer full, no window.
void SetSlidingLayers(DrafterConfig* config, const std::vector<int64_t>& ids, int64_t window);

// INVALID_ARGUMENT naming the field when the drafter cannot be built from `config`.
absl::Status ValidateDrafterConfig(const DrafterConfig& config);
// Its part for the output-head scales and DFlash2's settings (dflash2.cc).
absl::Status ValidateDflash2Config(const DrafterConfig& config);

// What the backward computes again instead of keeping from the forward (docs/memory.md): nothing
// beyond the cheap elementwise ops; the MLP's gate and up projections; or each whole layer (only
// its input is kept). The same values either way: the loss and gradients do not change.
enum class Recompute { kNone, kMlp, kLayers };

// "none" | "mlp" | "layers" (drafter.recompute in run.yaml).
std::optional<Recompute> ParseRecompute(const std::string& name);
const char* RecomputeName(Recompute r);

struct DrafterOptions {
  c10::ScalarType dtype = c10::ScalarType::Float;  // parameters (fp32 master weights)
  // Activations and matmuls (method.md §4: bf16 compute with fp32 master weights). The forward
  // casts every parameter to it (differentiably: gradients arrive in `dtype`). Unset: `dtype`.
  std::optional<c10::ScalarType> compute_dtype;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // Initialization (HF Qwen3 style): projections N(0, init_std) from a CPU generator seeded with
  // `seed` (the same values on every device), RMSNorm weights 1.
  uint64_t seed = 0;
  double init_std = 0.02;
  Recompute recompute = Recompute::kNone;
  // drafter.precision: fp8 (docs/method.md §4.1): the layers' linear projections (fc, q, k, v, o,
  // gate, up, down) as e4m3 GEMMs with rowwise scales, forward and backward (fp8_linear.h); needs
  // a bf16 compute dtype. The frozen embedding and head, norms, attention and loss are unchanged.
  bool fp8 = false;
};

// One packed batch. Tensors may live on any device; they are moved to the model's device.
struct DrafterBatch {
  at::Tensor features;    // [T, K*H] floating point: target features of every packed position
  at::Tensor input_ids;   // [T] int64 in [0, V)
  at::Tensor positions;   // [T] int64, restarting at 0 in each document
  at::Tensor cu_seqlens;  // [b+1] int32: document d is rows cu[d]..cu[d+1]-1, from 0 to T
  // [n] int64: anchor rows, strictly ascending among entries >= 0; -1 marks a padding block, whose
  // slots all hold MASK at positions 0..B-1, see nothing in attention and carry weight 0.
  at::Tensor anchors;
  at::Tensor loss_mask;  // [T] bool or numeric, nonzero on supervised tokens; used by Loss only
  // Optional [n] int64 in [1, B] (inference): block j's slots from block_lengths[j] on are not
  // attended to, so the slots before compute what a block of that many slots would (BlockMask).
  at::Tensor block_lengths;
};

// How the slots of a block are weighted in the loss (docs/method.md, "Loss weighting").
enum class LossWeighting {
  kDecay,  // fixed: exp(-(k-1)/gamma) for slot k >= 1
  kDpace,  // D-PACE: from the batch's own detached per-slot confidences, see DpaceWeights
};

struct LossOptions {
  double gamma = 0;  // slot weight decay; 0: config::DefaultGamma(block_size) (method.md §3.5)
  LossWeighting weighting = LossWeighting::kDecay;
  double dpace_alpha = 0.5;  // D-PACE's confidence smoothing, in (0, 1]
  // Query rows whose logits exist at once (method.md §6): 1024 rows x 151936 tokens = 622 MB fp32.
  int64_t logits_chunk_rows = 1024;
  // DFlash2: the candidate selector's loss is added times this (docs/method.md §2.2), after
  // selector_warmup_steps optimizer steps without it and selector_ramp_steps of a linear rise
  // (SelectorAlphaAt; the trainer applies it per step).
  double selector_loss_alpha = 1.0;
  int64_t selector_warmup_steps = 0, selector_ramp_steps = 0;
};

// The selector loss's factor at optimizer step `step` (0-based): 0 during the warm-up, then
// alpha * (step - warmup + 1) / (ramp + 1) over the ramp's steps, alpha from warmup + ramp on.
double SelectorAlphaAt(const LossOptions& options, int64_t step);

// method.md §3.4-3.6 for one micro-batch. The caller sums numerators and denominators over the
// optimizer step, back-propagates the numerator and scales gradients by 1/denominator once.
struct DrafterLoss {
  at::Tensor numerator;     // 0-dim fp32: sum w * CE; differentiable
  at::Tensor denominator;   // 0-dim fp32: sum w; constant
  at::Tensor slot_correct;  // [B] int64: supervised slots (w > 0) whose argmax == label
  at::Tensor slot_total;    // [B] int64: supervised slots; slot 0 is always 0
};

// D-PACE slot weights of n blocks of B slots (docs/method.md, "Loss weighting"): from the
// supervised mask m [n, B] (0/1) and each slot's cross-entropy ce [n, B] (detached; any value where
// m is 0), with s_k = (1 - alpha) exp(-ce_k) + alpha where m_k = 1 and 1 elsewhere,
// P_k = s_0 ... s_k, the weight of slot k is m_k * sum_{j >= k} m_j P_j: the expected number of
// accepted slots from k on under the smoothed confidences. fp32 [n, B].
at::Tensor DpaceWeights(const at::Tensor& mask, const at::Tensor& ce, double alpha);

// Per query row (j*B + k), from method.md §3.4-3.5.
struct BlockTargets {
  at::Tensor labels;   // [Q] int64: input_ids[a_j + k] (clamped into range where w = 0)
  at::Tensor weights;  // [Q] fp32: [k>=1] loss_mask[a_j+k] [same doc] exp(-(k-1)/gamma)
};

struct NamedParameter {
  std::string name;  // method.md §7 checkpoint name, e.g. "layers.0.mlp.up_proj.weight"
  std::vector<int64_t> shape;
  at::Tensor tensor;  // the live parameter (requires_grad); undefined in specs
};

// The trainable tensors of decoder layer i; checkpoint names under "layers.i.".
struct DrafterLayerParams {
  at::Tensor input_norm;  // input_layernorm.weight [H]
  at::Tensor q_proj;      // self_attn.q_proj.weight [Hq*D, H]
  at::Tensor k_proj;      // self_attn.k_proj.weight [Hkv*D, H]
  at::Tensor v_proj;      // self_attn.v_proj.weight [Hkv*D, H]
  at::Tensor o_proj;      // self_attn.o_proj.weight [H, Hq*D]
  at::Tensor q_norm;      // self_attn.q_norm.weight [D]
  at::Tensor k_norm;      // self_attn.k_norm.weight [D]
  at::Tensor post_norm;   // post_attention_layernorm.weight [H]
  at::Tensor gate;        // mlp.gate_proj.weight [I, H]
  at::Tensor up;          // mlp.up_proj.weight [I, H]
  at::Tensor down;        // mlp.down_proj.weight [H, I]
  // DFlash2 (config.dflash2()), undefined otherwise: attention_conv.* and mlp_conv.*.
  at::Tensor attn_conv_base;  // attention_conv.base_kernel [2, Kc, H]: input, output side
  at::Tensor attn_conv_proj;  // attention_conv.kernel_projection.weight [2 * Kc * G, H]
  at::Tensor mlp_conv_base;   // mlp_conv.base_kernel [2, Kc, H]
  at::Tensor mlp_conv_proj;   // mlp_conv.kernel_projection.weight [2 * Kc * G, H]
};

// DFlash2's grouped dynamic causal convolution over the slots of each block (docs/method.md
// §2.2): x [Q, H] with Q = n * B rows, row j*B + k slot k of block j; delta [Q, Kc, G] the
// row's kernel offsets per tap and channel group; base [Kc, H]. Slot k's output is
// sum over taps t <= k, t < Kc of x[slot k - t] * (base[t] + delta[slot k, t, group]).
at::Tensor BlockConvolution(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& base,
                            int64_t block_size, int64_t group_size);

// Names and shapes of every drafter tensor, in checkpoint order (fc, hidden_norm, layers, norm).
std::vector<NamedParameter> ParameterSpecs(const DrafterConfig& config);

// The batch of one block per sequence after its whole context, as speculative decoding gives
// Forward: sequence j's context features [n_j - 1, K*H] (its tokens' but the last) and its tokens
// (n_j, the anchor last); the anchor's own row gets a zero feature, which no block reads.
// block_lengths: per sequence in [1, B], 0 for B (empty: all B).
DrafterBatch DecodingBatch(const std::vector<at::Tensor>& contexts,
                           const std::vector<std::vector<int64_t>>& tokens,
                           const std::vector<int64_t>& block_lengths, int64_t block_size);

// One sequence's context keys and values, kept between the blocks of speculative decoding
// (DrafterModel::ForwardCached; docs/method.md, "Drafting with a cache"): every context row's keys
// (after k_norm and RoPE at the row's position) and values in each layer, computed once, when the
// row arrives, instead of from all of the context at every block.
// Each layer's keys and values live in one buffer per sequence, [capacity, Hkv, D]: rows
// 0 .. rows-1 hold the context; the rest is scratch, where ForwardCached puts the anchor's row and
// the block's own keys and values of a single sequence, so that its attention reads the buffer in
// place. A buffer is allocated at the first extension with room for `reserve` rows (at least what
// that block needs) and, once outgrown, grows by half, the held rows copied.
struct DrafterKvCache {
  int64_t rows = 0;              // context rows held
  int64_t reserve = 0;           // rows to allocate at first (the caller's longest sequence)
  std::vector<at::Tensor> k, v;  // per layer [capacity, Hkv, D] in the compute dtype, on the device
};

// One sequence's next block for DrafterModel::ForwardCached.
struct CachedBlock {
  DrafterKvCache* cache = nullptr;
  // [m, K*H]: the context rows the cache lacks, those from cache->rows on (m may be 0). The block
  // sees rows 0 .. cache->rows + m - 1 and sits at position cache->rows + m.
  at::Tensor new_features;
  int64_t anchor_token = 0;  // slot 0's token
  int64_t block_length = 0;  // in [1, B]: slots from it on are not attended to; 0: B
};

class DrafterModel {
 public:
  // embed_tokens and lm_head [V, H] are the target's, used frozen (detached, never saved); with
  // tied target weights they are the same tensor. They may have another dtype than the drafter.
  static absl::StatusOr<std::unique_ptr<DrafterModel>> Create(const DrafterConfig& config,
                                                              const DrafterOptions& options,
                                                              const at::Tensor& embed_tokens,
                                                              const at::Tensor& lm_head);
  ~DrafterModel();
  DrafterModel(const DrafterModel&) = delete;
  DrafterModel& operator=(const DrafterModel&) = delete;

  // Final hidden states [Q, H] (after the final norm), row j*B + k for slot k of block j.
  absl::StatusOr<at::Tensor> Forward(const DrafterBatch& batch) const;
  // Inference: what Forward gives for one block per sequence after its whole context, with each
  // sequence's context keys and values taken from its cache, which is first extended by the new
  // rows (drafter_cached_forward.cc). Rows j*B + k as Forward's; no autograd graph.
  absl::StatusOr<at::Tensor> ForwardCached(const std::vector<CachedBlock>& blocks) const;
  // lm_head(hidden): [rows, V] in the compute dtype, times config.output_multiplier and
  // soft-capped by config.final_logit_softcapping. Materializes every row's logits: for
  // inspection and small batches; training uses Loss.
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& hidden) const;
  // DFlash2's candidate selector (config.dflash2()) over n blocks: hidden [n*B, H] from Forward
  // or ForwardCached, and each block's slot-0 token. Slot k (1..B-1) drafts one of the top
  // selector_top_k tokens of its logits, scored by its logit plus the low-rank transition from
  // the token drafted before it (slot 0's for slot 1): `pick` receives the scores [n, K] (fp32)
  // of one slot of every block and returns the chosen index per block (argmax: greedy). Returns
  // the drafted tokens [n, B-1] (int64, CPU); `candidates` receives [n, B-1, K] and `scores` each
  // slot's [n, K] when not null.
  using PickFn = std::function<at::Tensor(const at::Tensor& scores)>;
  absl::StatusOr<at::Tensor> SelectCandidates(const at::Tensor& hidden,
                                              const std::vector<int64_t>& anchor_tokens,
                                              const PickFn& pick, at::Tensor* candidates,
                                              std::vector<at::Tensor>* scores) const;
  // The weighted loss of Forward's output `hidden` for the same batch.
  absl::StatusOr<DrafterLoss> Loss(const DrafterBatch& batch, const at::Tensor& hidden,
                                   const LossOptions& options) const;
  // Labels and weights of the batch's query rows (validates the batch, including loss_mask).
  absl::StatusOr<BlockTargets> Targets(const DrafterBatch& batch, double gamma) const;

  // Every trainable tensor with its checkpoint name, in ParameterSpecs order.
  const std::vector<NamedParameter>& parameters() const { return params_; }
  const DrafterConfig& config() const { return config_; }
  const DrafterOptions& options() const { return options_; }
  c10::ScalarType compute_dtype() const { return options_.compute_dtype.value_or(options_.dtype); }
  // Which attention each layer runs, for the run's start event: "attention: fused kernels in
  // every layer", or where and why the reference runs (the CPU, the compute dtype, the head
  // geometry, a sliding window below the block size).
  std::string AttentionKernels() const;
  // Every kernel choice a run reports (the drafter worker's "kernels" in its settings echo):
  // AttentionKernels(), then "; mlp activation: fused swiglu | silu and mul (ATen)" and, for a
  // DFlash2 drafter, "; block convolution: fused | composition (ATen)".
  std::string Kernels() const;
  // The attention implementation (default: FusedDrafterAttention, which is the reference wherever
  // the fused kernel does not apply, e.g. on the CPU).
  void set_attention(std::shared_ptr<const DrafterAttention> attention) {
    attention_ = std::move(attention);
  }

 private:
  struct Prepared;
  DrafterModel(DrafterConfig config, DrafterOptions options);
  void InitParameters(const at::Tensor& embed_tokens, const at::Tensor& lm_head);
  // for_targets: what MakeTargets needs (with the loss mask); otherwise what the forward needs.
  absl::StatusOr<Prepared> Prepare(const DrafterBatch& batch, bool for_targets) const;
  at::Tensor RunForward(const std::shared_ptr<const Prepared>& prepared,
                        const at::Tensor& features) const;
  // The block stream's input [Q, H]: slot 0 the anchor token's embedding, the others MASK's.
  at::Tensor EmbedBlocks(const Prepared& p) const;
  // x [Q, H] -> [Q, H] through decoder layer `layer`; ctx [T, H].
  at::Tensor RunLayer(int64_t layer, const at::Tensor& x, const at::Tensor& ctx,
                      const Prepared& p) const;
  BlockTargets MakeTargets(const Prepared& p, double gamma) const;
  // A layer from its q [Q, Hq, D] and k, v [T + Q, Hkv, D] on: attention (the layer's mask),
  // o_proj (DFlash2: its output convolution with `attn_delta`) with the residual, then the MLP
  // block.
  at::Tensor FinishLayer(int64_t layer, const at::Tensor& x, const at::Tensor& q,
                         const at::Tensor& k, const at::Tensor& v, const Prepared& p,
                         const at::Tensor& attn_delta) const;
  // ForwardCached's parts: the caches extended by the new rows (each buffer with room for its
  // anchor's row and a block after them); a layer over the block rows with the blocks' cached
  // context keys and values (packed as `p` lays them out).
  void ExtendCaches(const std::vector<CachedBlock>& blocks) const;
  // A projection x W^T in the compute dtype (CastLinear), or with options_.fp8 the fp8 GEMMs of
  // fp8_linear.h.
  at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight) const;
  // A layer's SwiGLU MLP on h [Q, H]: lean_ops' SwiGluMlp (with fp8, its GEMMs in fp8).
  at::Tensor Mlp(const at::Tensor& h, const DrafterLayerParams& w) const;
  at::Tensor RunCachedLayer(int64_t layer, const at::Tensor& x,
                            const std::vector<CachedBlock>& blocks, const Prepared& p) const;

  DrafterConfig config_;
  DrafterOptions options_;
  std::vector<NamedParameter> params_;
  std::vector<DrafterLayerParams> layers_;  // the same tensors as params_, by role
  at::Tensor fc_, hidden_norm_, norm_;
  // DFlash2's selector: candidate_selector.predecessor_codebook / successor_codebook [V, R],
  // hidden_projection.weight [R, H].
  at::Tensor predecessor_codebook_, successor_codebook_, selector_projection_;
  // DFlash2's selector loss over the supervised rows (docs/method.md §2.2): hidden [S, H],
  // labels and predecessors [S] (the tokens at the row's slot and the slot before), weights [S],
  // top_k [S, K] int64: each row's unary top-K, from the unary loss's pass over the logits
  // (WeightedCeResult::top_k).
  struct SelectorTerm {
    at::Tensor numerator;  // 0-dim fp32, differentiable: sum w * CE over the K candidates
    at::Tensor correct;    // [S] bool: the selector's best candidate is the label (in its top-k)
  };
  SelectorTerm SelectorLoss(const at::Tensor& hidden, const at::Tensor& labels,
                            const at::Tensor& predecessors, const at::Tensor& weights,
                            const at::Tensor& top_k, const LossOptions& options) const;
  // A DFlash2 sublayer's input side: (convolved input, its output-side kernel offsets).
  std::pair<at::Tensor, at::Tensor> ConvIn(const at::Tensor& h, const at::Tensor& base,
                                           const at::Tensor& proj) const;
  at::Tensor ConvOut(const at::Tensor& y, const at::Tensor& delta, const at::Tensor& base) const;
  at::Tensor embed_tokens_, lm_head_;  // frozen, detached
  at::Tensor inv_freq_;                // [D/2] fp32 on the device
  std::shared_ptr<const DrafterAttention> attention_;
};

}  // namespace dflash::drafter

#include "common/plan/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/builtin_config.h"
#include "common/transport/transport.h"
#include "nlohmann/json.hpp"

namespace dflash::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Rows of logits the fused lm_head + cross-entropy holds at a time (common/kernels/fused_ce), fp32.
constexpr int64_t kLossChunkRows = 1024;
// Estimates, not predictions from the code: the caching allocator's reserve beyond its allocated
// peak (measured 0.4-3.2 GiB on the H200 runs of docs/benchmarks.md), and a CUDA context with
// LibTorch's and dflash's kernels loaded.
constexpr double kSlack = 0.05;
constexpr int64_t kCudaContextBytes = int64_t{512} << 20;

int64_t DtypeBytes(const std::string& dtype) { return dtype == "float32" ? 4 : 2; }

struct Shape {
  int64_t h, inter, vocab, q, kv, head_dim;
  bool tied;
};

Shape ShapeOf(const model::TransformerConfig& c) {
  return {c.hidden_size,
          c.intermediate_size,
          c.vocab_size,
          c.num_attention_heads * c.head_dim,
          c.num_key_value_heads * c.head_dim,
          c.head_dim,
          c.tie_word_embeddings};
}

// One decoder layer's parameters: q, k, v, o, gate, up, down, two norms (+ q/k norms, biases).
int64_t LayerParams(const Shape& s, bool qk_norm, bool attention_bias, bool mlp_bias) {
  int64_t n = s.h * s.q + 2 * s.h * s.kv + s.q * s.h + 3 * s.h * s.inter + 2 * s.h;
  if (qk_norm) n += 2 * s.head_dim;
  if (attention_bias) n += s.q + 2 * s.kv;
  if (mlp_bias) n += 2 * s.inter + s.h;
  return n;
}

// A hybrid target's gated delta-rule layer (common/nn/gated_delta.h), less its two norms: the
// input projections to q, k, v (conv_dim rows), z, b and a, the depthwise convolution, dt_bias,
// A_log, the gated norm and out_proj.
struct LinearShape {
  int64_t hv, dk, dv, vd, cd, in_rows;
};

LinearShape LinearShapeOf(const model::TransformerConfig& c) {
  LinearShape l;
  l.hv = c.linear_num_value_heads;
  l.dk = c.linear_key_head_dim;
  l.dv = c.linear_value_head_dim;
  l.vd = l.hv * l.dv;
  l.cd = 2 * c.linear_num_key_heads * l.dk + l.vd;
  l.in_rows = l.cd + l.vd + 2 * l.hv;
  return l;
}

int64_t LinearAttentionParams(const model::TransformerConfig& c, const Shape& s) {
  const LinearShape l = LinearShapeOf(c);
  return s.h * l.in_rows + l.cd * c.linear_conv_kernel_dim + 2 * l.hv + l.dv + l.vd * s.h;
}

// Rows of q_proj: with an output gate (Qwen3-Next, Qwen3.5) a gate row per query row.
int64_t QRows(const model::TransformerConfig& c, const Shape& s) {
  return c.attn_output_gate ? 2 * s.q : s.q;
}

// The target's decoder layers 0..layers-1: as LayerParams, except that a sparse (MoE) layer has a
// router [E, H], E experts of 3 * H * moe_intermediate_size and its shared expert (3 * H * Is and
// a gate [1, H]) instead of the dense MLP, and a hybrid's delta-rule layer has
// LinearAttentionParams instead of attention.
int64_t TargetLayersParams(const model::TransformerConfig& c, const Shape& s, int64_t layers) {
  const int64_t dense =
      LayerParams(s, c.qk_norm, c.attention_bias, c.mlp_bias) + (QRows(c, s) - s.q) * s.h;
  const int64_t dense_mlp = 3 * s.h * s.inter + (c.mlp_bias ? 2 * s.inter + s.h : 0);
  const int64_t shared = c.shared_expert_intermediate_size;
  const int64_t sparse_mlp = c.num_experts * (s.h + 3 * s.h * c.moe_intermediate_size) +
                             (shared > 0 ? 3 * s.h * shared + s.h : 0);
  const int64_t attention = dense - dense_mlp;  // with the two norms
  const int64_t linear = 2 * s.h + LinearAttentionParams(c, s);
  int64_t n = 0;
  for (int64_t i = 0; i < layers; ++i) {
    n += (model::IsLinearAttentionLayer(c, i) ? linear : attention) +
         (model::IsMoeLayer(c, i) ? sparse_mlp : dense_mlp);
  }
  return n;
}

// The copies one layer's fusing makes at load (the largest layer): q/k/v (or a delta-rule layer's
// input projections) concatenated, and the dense gate/up concatenated or a sparse layer's experts
// stacked ([E, 2I, H] and [E, H, I]) and its shared expert's gate/up concatenated.
int64_t FusedLayerParams(const model::TransformerConfig& c, const Shape& s, int64_t layers) {
  int64_t most = 0;
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t mixer = model::IsLinearAttentionLayer(c, i) ? s.h * LinearShapeOf(c).in_rows
                                                              : s.h * (QRows(c, s) + 2 * s.kv);
    const int64_t mlp = model::IsMoeLayer(c, i)
                            ? 3 * c.num_experts * s.h * c.moe_intermediate_size +
                                  2 * s.h * c.shared_expert_intermediate_size
                            : 2 * s.h * s.inter;
    most = std::max(most, mixer + mlp);
  }
  return most;
}

// A delta-rule layer's forward intermediates per token (elements of the model's dtype), as the
// CUDA kernels of common/kernels/gated_delta run it: in the model's dtype the projections, the
// convolution's activated output, q and k repeated to the value heads, the scan's output and the
// gated norm's; in fp32 the convolution's output, g, and the kernels' per-chunk tensors (w, the
// decayed queries and keys: 3 dk, u: dv, the chunk's attention row: 64, per value head).
// Documents are padded to a multiple of 64 rows: the plan allows 1/8 more rows (documents of 512
// tokens or more on average; a batch of short documents pads more). The MLP runs after these are
// freed (LayerIntermediatesPerToken).
int64_t LinearIntermediatesPerToken(const model::TransformerConfig& c, int64_t dtype_bytes) {
  const LinearShape l = LinearShapeOf(c);
  const int64_t chunked = l.hv * (3 * l.dk + l.dv + 64);
  const int64_t fp32 = l.cd + l.hv + chunked + chunked / 8;
  return l.in_rows + l.cd + 2 * l.hv * l.dk + 2 * l.vd + (4 * fp32) / dtype_bytes;
}

// One layer's forward intermediates per token, in elements of the model's dtype: attention
// (q, k, v, output, residuals) and the MLP: the dense gate/up/activation, or a sparse layer's
// top-k token copies in and out, the router's logits and fp32 probabilities, and one expert's
// gate/up rows at most for every chosen pair (and the shared expert's gate/up/activation).
// Hybrids' delta-rule layers: the larger of LinearIntermediatesPerToken and the MLP's.
int64_t LayerIntermediatesPerToken(const model::TransformerConfig& c, const Shape& s,
                                   int64_t layers, int64_t dtype_bytes) {
  int64_t most = 0;
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t k = c.num_experts_per_tok, e = c.num_experts;
    const int64_t mlp = model::IsMoeLayer(c, i) ? 2 * k * s.h + e + (8 * e) / dtype_bytes +
                                                      3 * k * c.moe_intermediate_size +
                                                      3 * c.shared_expert_intermediate_size
                                                : 4 * s.inter;
    most = std::max(most, model::IsLinearAttentionLayer(c, i)
                              ? std::max(LinearIntermediatesPerToken(c, dtype_bytes), mlp)
                              : QRows(c, s) + 2 * s.kv + mlp);
  }
  return most + 4 * s.h;
}

size_t Add(WorkerPlan* w, std::string name, std::string what, int64_t bytes) {
  w->terms.push_back({std::move(name), std::move(what), bytes});
  return w->terms.size() - 1;
}

void AddPhase(WorkerPlan* w, std::string name, std::vector<size_t> terms) {
  Phase p{std::move(name), std::move(terms), 0};
  for (size_t t : p.terms) p.bytes += w->terms[t].bytes;
  w->phases.push_back(std::move(p));
}

// Peak phase, extras, dominant term (the largest among `variable` in the peak phase, else the
// largest in it).
void Finish(WorkerPlan* w, const std::vector<size_t>& variable, int64_t transport_bytes,
            const std::string& transport_what) {
  for (size_t i = 0; i < w->phases.size(); ++i) {
    if (w->phases[i].bytes > w->phases[w->peak_phase].bytes) w->peak_phase = i;
  }
  const Phase& peak = w->phases[w->peak_phase];
  w->allocator_peak = peak.bytes;
  if (transport_bytes > 0)
    w->extra.push_back({"transport buffers", transport_what, transport_bytes});
  w->extra.push_back({"allocator slack", "estimate: 5% of the allocator's peak",
                      static_cast<int64_t>(kSlack * static_cast<double>(peak.bytes))});
  w->extra.push_back({"CUDA context", "estimate", kCudaContextBytes});
  w->device_bytes = w->allocator_peak;
  for (const Term& t : w->extra) w->device_bytes += t.bytes;
  int64_t best = -1;
  for (size_t t : peak.terms) {
    const bool var = std::find(variable.begin(), variable.end(), t) != variable.end();
    if (var && w->terms[t].bytes > best) {
      best = w->terms[t].bytes;
      w->dominant_term = t;
    }
  }
  if (best < 0) {
    for (size_t t : peak.terms) {
      if (w->terms[t].bytes > best) {
        best = w->terms[t].bytes;
        w->dominant_term = t;
      }
    }
  }
}

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f", static_cast<double>(bytes) / kGiB);
}

// The table's unit: GiB, or MiB for plans whose workers stay under 1 GiB (the CPU demo's).
struct Unit {
  const char* name;
  double bytes;
  std::string operator()(int64_t b) const {
    return absl::StrFormat("%.2f", static_cast<double>(b) / bytes);
  }
};

// The drafter's parameters: its layers, fc with hidden_norm, the final norm, and with DFlash2
// (docs/method.md §2.2) per layer two convolutions (base [2, Kc, H] and the kernel projection
// [2 Kc G, H]) and the selector's codebooks [V, R] and projection [R, H].
int64_t DrafterParams(const config::RunSpec& spec, const Shape& s, int64_t k) {
  const int64_t ld = spec.drafter.layers;
  int64_t n = ld * LayerParams(s, /*qk_norm=*/true, false, false) + k * s.h * s.h + 2 * s.h;
  if (spec.drafter.kind == "dflash2") {
    const config::Dflash2Settings two = config::ResolvedDflash2(spec.drafter);
    const int64_t conv_k = two.conv_kernel_size;
    const int64_t groups = s.h / std::max<int64_t>(1, two.conv_group_size);
    n += ld * 2 * (2 * conv_k * s.h + 2 * conv_k * groups * s.h) + 2 * s.vocab * two.selector_rank +
         two.selector_rank * s.h;
  }
  return n;
}

// The drafter worker (common/drafter, common/train/trainer.cc), from what the code keeps and when
// (docs/memory.md, "The drafter's phases"): fp32 master weights and AdamW's two moments; the
// target's lm_head, frozen (an untied embed_tokens stays in host memory); one weight's compute
// cast at a time (common/drafter/lean_ops.h casts per product, forward and backward); per layer
// the query rows' saved activations (x, h, q before and after norm + RoPE, k and v, the
// attention's output, y, the MLP's input, gate and up) and the context rows' keys (before and
// after norm + RoPE) and values; outside the layers fc's output and ctx over the context rows,
// and four [Q, H] rows tensors (the last layer's output, the final norm's output that the trainer
// holds, the supervised rows and the fused loss's gradient, kept to the end of the backward).
// Phases: the end of the forward (inside the loss: one chunk of logits), the backward of the
// last layer's MLP (every activation still kept, the MLP's intermediates and its weights'
// gradients), the backward of layer 0's MLP and attention (every later layer's gradients, layer
// 0's activations), and the end of the backward (every gradient, fc's included).
void PlanDrafter(const config::RunSpec& spec, const model::TransformerConfig& target,
                 const Shape& s, int64_t k, int64_t features,
                 const transport::FeatureBuffers& buffers, const std::string& name,
                 WorkerPlan* out) {
  WorkerPlan& dw = *out;
  dw.role = "drafter";
  const int64_t db = DtypeBytes(spec.target.dtype);
  const int64_t t = spec.batching.token_budget;
  const int64_t q_rows = spec.batching.max_anchors * spec.drafter.block_size;
  const int64_t ld = spec.drafter.layers;
  const bool dflash2 = spec.drafter.kind == "dflash2";
  const config::Dflash2Settings two = config::ResolvedDflash2(spec.drafter);
  const int64_t rank = two.selector_rank;
  const int64_t top_k = two.selector_top_k;
  const int64_t layer_params = LayerParams(s, /*qk_norm=*/true, false, false);
  const int64_t fc_params = k * s.h * s.h + s.h;  // fc and hidden_norm
  const int64_t drafter_params = DrafterParams(spec, s, k);
  const int64_t mlp_params = 3 * s.h * s.inter;
  const size_t master =
      Add(&dw, "master weights",
          absl::StrCat("fp32, ", drafter_params, " parameters (", ld, " layers + fc)"),
          drafter_params * 4);
  const size_t adam = Add(&dw, "AdamW state", "fp32 exp_avg + exp_avg_sq", drafter_params * 8);
  const size_t frozen =
      Add(&dw, "frozen lm_head",
          absl::StrCat(spec.target.dtype, ", the target's",
                       s.tied ? " (tied to embed_tokens)" : "; embed_tokens stays in host memory"),
          s.vocab * s.h * db);
  const size_t casts = Add(&dw, "compute casts of the weights",
                           db < 4 ? absl::StrCat(spec.target.dtype, ", one weight at a time")
                                  : std::string("none (fp32 compute)"),
                           db < 4 ? s.h * std::max(s.inter, s.q) * db : 0);
  const size_t feats = Add(&dw, "features",
                           buffers.drafter_device_copies > 0
                               ? absl::StrCat(t, " x ", k * s.h, ", copied to the device")
                               : absl::StrCat("none: read in place (", name, ")"),
                           buffers.drafter_device_copies * features);
  const int64_t mlp_row = 2 * s.inter * db;  // gate and up
  const int64_t row = (4 * s.h + 3 * s.q + 3 * s.kv) * db + mlp_row;
  const int64_t ctx = 3 * s.kv * db;
  const int64_t layer_acts = q_rows * row + t * ctx;
  const int64_t rows_h = q_rows * s.h * db;  // one [Q, H] tensor
  const int64_t ctx_h = t * s.h * db;        // one [T, H] tensor
  // fc's output and ctx; the last layer's output, the final norm's, the supervised rows and the
  // loss's gradient (in the backward: the incoming gradient and the MLP's input gradient instead
  // of the first and the third).
  const int64_t outside = 2 * ctx_h + 4 * rows_h;
  // drafter.recompute (DrafterOptions::recompute): what the backward computes again.
  const std::string& recompute = spec.drafter.recompute;
  int64_t kept = ld * layer_acts;
  std::string what = absl::StrCat(ld, " layers x (", q_rows, " query rows + ", t, " context rows)");
  if (recompute == "mlp") {
    kept = ld * (layer_acts - q_rows * mlp_row);
    what += " less gate and up";
  } else if (recompute == "layers") {
    kept = ld * rows_h;
    what = absl::StrCat(ld, " layer inputs (", q_rows, " rows)");
  }
  // Sliding-attention layers whose window is below the block size run the reference attention
  // (the fused kernels take the others, as they take full layers: docs/method.md §2.1): each
  // block's scores against the context rows it can see (at most window - 1 before its anchor)
  // and its own rows, whose probabilities the backward keeps (the compute dtype's and softmax's
  // fp32 output), with the gathered keys and values of those rows, for every such layer (one at
  // a time with recompute: layers).
  absl::StatusOr<run::SlidingLayers> sliding = run::RunSlidingLayers(spec);
  const bool narrow_window =
      sliding.ok() && sliding->window > 0 && sliding->window < spec.drafter.block_size;
  const int64_t n_sliding =
      sliding.ok() && narrow_window ? static_cast<int64_t>(sliding->layers.size()) : 0;
  const int64_t seen = narrow_window ? std::min<int64_t>(t, sliding->window - 1) : t;
  const int64_t dense_layer =
      q_rows * target.num_attention_heads * (seen + spec.drafter.block_size) * (db + 4) +
      spec.batching.max_anchors * seen * 2 * s.kv * db;
  if (n_sliding > 0 && recompute != "layers") {
    kept += n_sliding * dense_layer;
    what += absl::StrCat("; ", n_sliding, " sliding layer(s) x attention probabilities (", q_rows,
                         " x ", target.num_attention_heads, " heads x ",
                         seen + spec.drafter.block_size, ") and the rows' keys and values");
  }
  const size_t acts = Add(&dw, "activations",
                          absl::StrCat(what, "; fc's output and ctx (", t, " rows), 4 x [", q_rows,
                                       ", ", s.h, "] around the loss"),
                          kept + outside);
  const int64_t logits_bytes = db;  // the fused loss's logits are in lm_head's dtype
  const size_t chunk =
      Add(&dw, "loss chunk",
          absl::StrCat(spec.target.dtype, " logits, ", kLossChunkRows, " rows x ", s.vocab),
          kLossChunkRows * s.vocab * logits_bytes);
  // DFlash2's selector loss keeps, for the backward, each query row's fp32 scores and successor
  // codes; the K lm_head rows of a row are gathered a chunk of rows at a time (GatheredRowLogits),
  // again in the backward.
  const size_t selector =
      Add(&dw, "selector loss",
          dflash2 ? absl::StrCat(q_rows, " rows x ", top_k, " candidates x ", rank + 2,
                                 " (fp32 codes and scores) + ", kLossChunkRows, " rows x ", top_k,
                                 " x ", s.h, " (one chunk of lm_head rows)")
                  : std::string("none (drafter.kind dflash)"),
          dflash2 ? q_rows * top_k * (rank + 2) * 4 + kLossChunkRows * top_k * s.h * db : 0);
  AddPhase(&dw, "end of the forward", {master, adam, frozen, casts, feats, acts, chunk, selector});
  const bool layers = recompute == "layers";
  // What the last layer's backward computes again: with recompute: layers the whole layer under
  // its checkpoint (its activations and its output, the root of the inner backward), with
  // recompute: mlp gate and up.
  int64_t again = 0;
  std::string again_what = "none (drafter.recompute none)";
  if (layers) {
    again = layer_acts + rows_h + (n_sliding > 0 ? dense_layer : 0);
    again_what = absl::StrCat(q_rows, " query rows + ", t, " context rows, and the output");
  } else if (recompute == "mlp") {
    again = q_rows * mlp_row;
    again_what = absl::StrCat("gate and up, [", q_rows, ", ", s.inter, "] each");
  }
  const size_t recomputed = Add(&dw, "recomputed in the last layer", again_what, again);
  // With recompute: layers the end of the forward is not the forward's peak: each layer runs
  // whole under its checkpoint and drops its activations after, so the last one's are alive
  // beside every layer's kept input. Never the worker's peak (the backward adds the gradients to
  // it), but the memory a forward needs.
  if (layers) {
    AddPhase(&dw, "during the forward", {master, adam, frozen, casts, feats, acts, recomputed});
  }
  // SwiGluMlp's backward (lean_ops.cc): the product's gradient and up's, beside gate and up
  // (kept or recomputed); and the MLP weights' fp32 gradients.
  const size_t mlp_bwd =
      Add(&dw, "MLP backward intermediates", absl::StrCat("2 x [", q_rows, ", ", s.inter, "]"),
          2 * q_rows * s.inter * db);
  const size_t mlp_grads = Add(&dw, "gradients of one MLP",
                               absl::StrCat("fp32, ", mlp_params, " parameters"), mlp_params * 4);
  AddPhase(&dw, "last layer's MLP backward",
           {master, adam, frozen, casts, feats, acts, selector, recomputed, mlp_bwd, mlp_grads});
  // Layer 0's backward: every later layer's gradients and its own MLP's; its activations (kept,
  // or recomputed), the rows around the loss and the context rows' accumulated gradient.
  const int64_t before_fc = drafter_params - fc_params - (layer_params - mlp_params);
  const size_t later_grads =
      Add(&dw, "gradients before layer 0's attn",
          absl::StrCat("fp32, ", before_fc, " parameters (all but fc and layer 0's attention)"),
          before_fc * 4);
  const size_t last_layer =
      Add(&dw, "backward: layer 0's activations",
          absl::StrCat(q_rows, " query rows + ", t, " context rows", layers ? ", recomputed" : "",
                       "; fc's output, ctx and its gradient; 4 x [", q_rows, ", ", s.h, "]"),
          layer_acts + (n_sliding > 0 ? dense_layer : 0) + outside + ctx_h);
  AddPhase(&dw, "layer 0's MLP backward",
           {master, adam, frozen, casts, feats, selector, later_grads, last_layer, mlp_bwd});
  // The fused attention's backward (common/kernels/dflash_attn) beside a layer's activations: dQ
  // accumulated in fp32 and written in the compute dtype, zeroed dK and dV over the context and
  // block rows, the contiguous dO, and the rows' delta.
  const int64_t attn_bwd = q_rows * s.q * (4 + 2 * db) + 2 * (t + q_rows) * s.kv * db +
                           q_rows * target.num_attention_heads * 4;
  const size_t attn_scratch =
      Add(&dw, "attention backward scratch",
          absl::StrCat("fp32 dQ of ", q_rows, " rows, dQ, dO, dK and dV of ", t + q_rows, " rows"),
          attn_bwd);
  AddPhase(&dw, "layer 0's attention backward",
           {master, adam, frozen, casts, feats, selector, later_grads, last_layer, attn_scratch});
  // fc's weight gradient last: every gradient, fc's output and ctx with their gradients, the
  // final norm's output and the loss's gradient.
  const size_t grads = Add(&dw, "gradients", "fp32", drafter_params * 4);
  const size_t tail = Add(&dw, "fc's rows and their gradients",
                          absl::StrCat("fc's output, ctx and their gradients (", t, " rows); 2 x [",
                                       q_rows, ", ", s.h, "]"),
                          4 * ctx_h + 2 * rows_h);
  AddPhase(&dw, "end of the backward", {master, adam, frozen, casts, feats, grads, tail});
  Finish(&dw, {acts, last_layer, recomputed, mlp_bwd, attn_scratch, feats},
         buffers.drafter_receive_buffers * features,
         absl::StrCat(name, ": ", buffers.drafter_receive_buffers, " receive buffers of ", t, " x ",
                      k * s.h, " features"));
}

}  // namespace

absl::StatusOr<RunPlan> PlanRun(const config::RunSpec& spec, const model::TransformerConfig& target,
                                transport::Transport transport) {
  absl::StatusOr<std::vector<int64_t>> ids = run::RunLayerIds(spec, target);
  if (!ids.ok()) return ids.status();
  RunPlan plan;
  plan.token_budget = spec.batching.token_budget;
  plan.max_anchors = spec.batching.max_anchors;
  plan.transport = transport;
  const transport::FeatureBuffers buffers = transport::BuffersOf(transport);
  const std::string name = transport::TransportName(transport);
  const Shape s = ShapeOf(target);
  const int64_t db = DtypeBytes(spec.target.dtype);
  const int64_t k = static_cast<int64_t>(ids->size());
  // eval.every_steps > 0: the target is loaded with every layer, shared with the evaluator.
  const bool evaluates = spec.eval.every_steps > 0;
  const int64_t run_layers =
      evaluates ? target.num_hidden_layers : 1 + *std::max_element(ids->begin(), ids->end());
  const int64_t t = plan.token_budget;
  const int64_t features = t * k * s.h * db;
  const int64_t embed = s.vocab * s.h * (s.tied ? 1 : 2);  // embed_tokens (+ lm_head)

  // Target worker (common/nn/target_model.cc): weights of the layers up to the last feature
  // layer; at load the per-layer q/k/v and gate/up are concatenated into fused matrices while the
  // loaded ones are still held: one layer at a time from a checkpoint (TargetModel::Load), every
  // layer for a built-in target (FromTensors: the drawn tensors live until it returns); the
  // forward keeps the features and one layer's intermediates.
  // placement.target_parallel = n: each of the n processes holds 1/n of every layer
  // (common/nn/tensor_parallel.h; embeddings and norms whole) and about 1/n of a layer's
  // intermediates besides the two all-reduced [T, H] outputs.
  WorkerPlan& tw = plan.target;
  tw.role = "target";
  const bool moe = target.num_experts > 0;
  const int64_t tp = spec.placement.target_parallel;
  const size_t weights =
      Add(&tw, "weights",
          absl::StrCat(spec.target.dtype, ", ", run_layers, " of ", target.num_hidden_layers,
                       " layers", moe ? absl::StrCat(" (", target.num_experts, " experts)") : "",
                       tp > 1 ? absl::StrCat(", 1/", tp, " of each (tensor parallel)") : "",
                       " + embed_tokens", s.tied ? "" : " + lm_head", " + final norm"),
          (embed + TargetLayersParams(target, s, run_layers) / tp + s.h) * db);
  // A checkpoint is read, and a built-in target's drawn tensors are taken, one layer at a time:
  // each layer's originals go once fused (TargetModel::Load, FromTensors).
  const size_t fused = Add(&tw, "fused copies at load",
                           absl::StrCat("q/k/v and gate/up concatenated",
                                        moe ? ", experts stacked" : "", ", one layer at a time"),
                           FusedLayerParams(target, s, run_layers) * db);
  const size_t forward = Add(
      &tw, "forward",
      absl::StrCat(t, " tokens: features (", k, " x ", s.h, ") + one layer's intermediates"),
      t *
          (k * s.h + (tp > 1 ? LayerIntermediatesPerToken(target, s, run_layers, db) / tp + 2 * s.h
                             : LayerIntermediatesPerToken(target, s, run_layers, db))) *
          db);
  AddPhase(&tw, "loading the target", {weights, fused});
  AddPhase(&tw, "forward", {weights, forward});
  if (evaluates) {
    // An evaluation (services/target_worker/evaluator.cc) beside a forward of the run-ahead step:
    // the drafter snapshot in the target's dtype (spec::SetInferenceDrafterOptions), and the KV
    // caches of one batch of prompts (16 at most, each up to data.max_length prompt tokens +
    // eval.max_new_tokens + a block).
    const int64_t drafter_params = DrafterParams(spec, s, k);  // DFlash2's too: it is exported
    const int64_t batch = std::min<int64_t>(16, spec.eval.max_prompts);
    const int64_t positions =
        spec.data.max_length + spec.eval.max_new_tokens + spec.drafter.block_size;
    const size_t snapshot = Add(
        &tw, "evaluation: drafter snapshot",
        absl::StrCat(spec.target.dtype, ", ", drafter_params, " parameters"), drafter_params * db);
    const size_t kv = Add(&tw, "evaluation: KV caches",
                          absl::StrCat(batch, " prompts x ", positions, " positions x ",
                                       target.num_hidden_layers, " layers"),
                          batch * positions * target.num_hidden_layers * 2 * s.kv * db);
    // The drafter's cache of each prompt's context keys and values (spec::SpeculativeGenerate
    // with SpecDecodeOptions::drafter_kv_cache), in the compute dtype.
    const size_t drafter_kv = Add(&tw, "evaluation: drafter caches",
                                  absl::StrCat(batch, " prompts x ", positions, " positions x ",
                                               spec.drafter.layers, " drafter layers"),
                                  batch * positions * spec.drafter.layers * 2 * s.kv * db);
    AddPhase(&tw, "evaluation during a forward", {weights, forward, snapshot, kv, drafter_kv});
  }
  int64_t slots = 0;
  std::string slots_what;
  if (buffers.target_device_slots > 0) {
    slots = buffers.target_device_slots * features;
    slots_what = absl::StrCat(name, ": ", buffers.target_device_slots, " slots of ", t, " x ",
                              k * s.h, " features");
  }
  Finish(&tw, {forward}, slots, slots_what);

  // Drafter worker: PlanDrafter below.
  PlanDrafter(spec, target, s, k, features, buffers, name, &plan.drafter);
  return plan;
}

absl::Status CheckFits(const config::RunSpec& spec, const model::TransformerConfig& target,
                       transport::Transport transport, const std::string& role,
                       const std::string& worker, int64_t capacity_bytes) {
  if (capacity_bytes <= 0) return absl::OkStatus();
  absl::StatusOr<RunPlan> plan = PlanRun(spec, target, transport);
  if (!plan.ok()) return plan.status();
  const WorkerPlan& w = role == "target" ? plan->target : plan->drafter;
  if (w.device_bytes <= capacity_bytes) return absl::OkStatus();
  const Term& dom = w.terms[w.dominant_term];
  // The setting the dominant term follows, lowered until the worker fits.
  std::string field;
  int64_t config::BatchingSpec::*member = nullptr;
  int64_t step = 0;
  // A drafter's activations, whether kept (the end of the forward) or recomputed beside the
  // gradients (the end of the backward, recompute: layers), and the attention's backward scratch
  // all grow with the query rows, i.e. the anchors.
  const bool query_rows =
      dom.name == "activations" || dom.name == "backward: layer 0's activations" ||
      dom.name == "recomputed in the last layer" || dom.name == "MLP backward intermediates" ||
      dom.name == "attention backward scratch";
  if (query_rows && role == "drafter") {
    field = "batching.max_anchors";
    member = &config::BatchingSpec::max_anchors;
    step = 32;
  } else if (dom.name == "forward" || dom.name == "features" || dom.name == "activations") {
    field = "batching.token_budget";
    member = &config::BatchingSpec::token_budget;
    step = 512;
  }
  std::string fix;
  if (member != nullptr) {
    config::RunSpec smaller = spec;
    // Not below what validation allows: a document of data.max_length must fit a micro-batch.
    const int64_t floor = member == &config::BatchingSpec::token_budget
                              ? std::max<int64_t>(step, spec.data.max_length)
                              : step;
    for (int64_t v = spec.batching.*member - step; v >= floor; v -= step) {
      smaller.batching.*member = v;
      absl::StatusOr<RunPlan> p = PlanRun(smaller, target, transport);
      if (!p.ok()) break;
      const WorkerPlan& pw = role == "target" ? p->target : p->drafter;
      if (pw.device_bytes <= capacity_bytes) {
        fix = absl::StrCat("; ", field, " ", spec.batching.*member, " -> ", v, " fits");
        break;
      }
    }
  }
  // The same batches with less kept for the backward (drafter.recompute), the cheapest first.
  std::string recompute_fix;
  if (role == "drafter") {
    config::RunSpec r = spec;
    const std::vector<std::string>& modes = config::RecomputeModes();  // less kept each
    const auto current = std::find(modes.begin(), modes.end(), spec.drafter.recompute);
    for (auto it = current == modes.end() ? modes.end() : current + 1; it != modes.end(); ++it) {
      const std::string& mode = *it;
      r.drafter.recompute = mode;
      absl::StatusOr<RunPlan> p = PlanRun(r, target, transport);
      if (p.ok() && p->drafter.device_bytes <= capacity_bytes) {
        recompute_fix = absl::StrCat("drafter.recompute: ", mode,
                                     " fits with the same batches (slower: the backward "
                                     "recomputes ",
                                     mode == "mlp" ? "the MLP's gate and up" : "every layer", ")");
        break;
      }
    }
  }
  if (!recompute_fix.empty()) {
    fix =
        fix.empty() ? absl::StrCat("; ", recompute_fix) : absl::StrCat(fix, "; or ", recompute_fix);
  }
  if (fix.empty() && role == "drafter") {
    config::RunSpec fewer = spec;
    for (int64_t l = spec.drafter.layers - 1; l >= 1 && fix.empty(); --l) {
      fewer.drafter.layers = l;
      absl::StatusOr<RunPlan> p = PlanRun(fewer, target, transport);
      if (p.ok() && p->drafter.device_bytes <= capacity_bytes) {
        fix = absl::StrCat("; drafter.layers ", spec.drafter.layers, " -> ", l, " fits");
      }
    }
  }
  if (fix.empty()) fix = "; no smaller setting fits: it needs a GPU with more memory";
  return absl::FailedPreconditionError(absl::StrCat(
      "memory plan: the ", role, " worker ", worker, " needs ", GiB(w.device_bytes),
      " GiB (allocator peak ", GiB(w.allocator_peak), " GiB ", w.phases[w.peak_phase].name,
      ") of its GPU's ", GiB(capacity_bytes), " GiB; the largest term is ", dom.name, " (",
      GiB(dom.bytes), " GiB: ", dom.what, ")", fix));
}

absl::Status CheckSharedGpuFits(const config::RunSpec& spec, const model::TransformerConfig& target,
                                const std::string& gpu, int64_t capacity_bytes) {
  if (capacity_bytes <= 0) return absl::OkStatus();
  const auto need = [&](const config::RunSpec& s) -> absl::StatusOr<int64_t> {
    absl::StatusOr<RunPlan> p = PlanRun(s, target, transport::Transport::kCudaIpc);
    if (!p.ok()) return p.status();
    return p->target.device_bytes + p->drafter.device_bytes;
  };
  absl::StatusOr<RunPlan> plan = PlanRun(spec, target, transport::Transport::kCudaIpc);
  if (!plan.ok()) return plan.status();
  const int64_t total = plan->target.device_bytes + plan->drafter.device_bytes;
  if (total <= capacity_bytes) return absl::OkStatus();
  const WorkerPlan& big =
      plan->drafter.device_bytes >= plan->target.device_bytes ? plan->drafter : plan->target;
  const Term& dom = big.terms[big.dominant_term];
  std::string fix;
  for (int64_t v = spec.batching.max_anchors - 32; v >= 32 && fix.empty(); v -= 32) {
    config::RunSpec s = spec;
    s.batching.max_anchors = v;
    absl::StatusOr<int64_t> n = need(s);
    if (n.ok() && *n <= capacity_bytes) {
      fix = absl::StrCat("; batching.max_anchors ", spec.batching.max_anchors, " -> ", v, " fits");
    }
  }
  if (fix.empty()) fix = "; no smaller max_anchors fits: put the pair on two GPUs (nccl)";
  return absl::FailedPreconditionError(absl::StrCat(
      "memory plan: the target and drafter workers sharing ", gpu, " need ", GiB(total), " GiB (",
      GiB(plan->target.device_bytes), " + ", GiB(plan->drafter.device_bytes), ") of its ",
      GiB(capacity_bytes), " GiB; the largest term is the ", big.role, "'s ", dom.name, " (",
      GiB(dom.bytes), " GiB: ", dom.what, ")", fix));
}

std::string PlanTable(const RunPlan& plan, int64_t target_capacity, int64_t drafter_capacity) {
  const bool small = std::max(plan.target.allocator_peak, plan.drafter.allocator_peak) < kGiB;
  const Unit u = small ? Unit{"MiB", 1024.0 * 1024.0} : Unit{"GiB", kGiB};
  std::string out = absl::StrCat("memory plan: ", plan.token_budget, " tokens, ", plan.max_anchors,
                                 " anchors, transport ", transport::TransportName(plan.transport),
                                 " (", u.name, ")\n");
  for (const auto& [w, cap] : {std::make_pair(&plan.target, target_capacity),
                               std::make_pair(&plan.drafter, drafter_capacity)}) {
    absl::StrAppend(&out, "\n", w->role, " worker\n");
    for (size_t i = 0; i < w->terms.size(); ++i) {
      const Term& t = w->terms[i];
      const bool at_peak =
          std::find(w->phases[w->peak_phase].terms.begin(), w->phases[w->peak_phase].terms.end(),
                    i) != w->phases[w->peak_phase].terms.end();
      absl::StrAppend(&out, absl::StrFormat("  %-36s %8s %s %s\n", t.name, u(t.bytes),
                                            at_peak ? "*" : " ", t.what));
    }
    for (const Phase& p : w->phases) {
      absl::StrAppend(&out, absl::StrFormat("  %-36s %8s\n", "phase: " + p.name, u(p.bytes)));
    }
    absl::StrAppend(&out, absl::StrFormat("  %-36s %8s   (* = alive then)\n", "allocator peak",
                                          u(w->allocator_peak)));
    for (const Term& t : w->extra) {
      absl::StrAppend(&out, absl::StrFormat("  %-36s %8s   %s\n", t.name, u(t.bytes), t.what));
    }
    absl::StrAppend(&out, absl::StrFormat("  %-36s %8s", "device total", u(w->device_bytes)));
    if (cap > 0) {
      absl::StrAppend(&out, " of ", u(cap), w->device_bytes <= cap ? " (fits)" : " (DOES NOT FIT)");
    } else {
      absl::StrAppend(&out, "   (no registered GPU of this role: not checked)");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string PlanJson(const RunPlan& plan, int64_t target_capacity, int64_t drafter_capacity) {
  nlohmann::json j;
  j["token_budget"] = plan.token_budget;
  j["max_anchors"] = plan.max_anchors;
  j["transport"] = transport::TransportName(plan.transport);
  for (const auto& [w, cap] : {std::make_pair(&plan.target, target_capacity),
                               std::make_pair(&plan.drafter, drafter_capacity)}) {
    nlohmann::json jw;
    for (const Term& t : w->terms) {
      jw["terms"].push_back({{"name", t.name}, {"what", t.what}, {"bytes", t.bytes}});
    }
    for (const Phase& p : w->phases) {
      nlohmann::json names = nlohmann::json::array();
      for (size_t i : p.terms) names.push_back(w->terms[i].name);
      jw["phases"].push_back({{"name", p.name}, {"bytes", p.bytes}, {"terms", names}});
    }
    for (const Term& t : w->extra) {
      jw["extra"].push_back({{"name", t.name}, {"what", t.what}, {"bytes", t.bytes}});
    }
    jw["peak_phase"] = w->phases[w->peak_phase].name;
    jw["allocator_peak_bytes"] = w->allocator_peak;
    jw["device_bytes"] = w->device_bytes;
    jw["dominant_term"] = w->terms[w->dominant_term].name;
    jw["capacity_bytes"] = cap;
    jw["fits"] = cap <= 0 ? nlohmann::json(nullptr) : nlohmann::json(w->device_bytes <= cap);
    j[w->role] = jw;
  }
  return j.dump(2) + "\n";
}

}  // namespace dflash::plan

// Throughput and peak memory of TargetModel::Forward on one GPU for a Qwen3-8B-shaped target with
// random bf16 weights (H=4096, 32/8 heads, head_dim 128, I=12288, V=151936, 36 layers, qk_norm;
// layer ids [1, 9, 17, 25, 33], so layers 0..33 run). Each case packs 8192 tokens:
//   mix      documents of 100..2000 tokens drawn with splitmix64 (the same lengths as
//            target_forward_hf.py, which runs them one by one through HF transformers)
//   4 docs   4 x 2048;   64 docs  64 x 128;   1 doc  one 8192-token document.
// Per case: 2 warm-up forwards, then the median of --runs timed forwards (host clock around a
// forward followed by a device synchronize). Peak memory is the CUDA caching allocator's peak of
// allocated bytes, reset before each case; "above weights" subtracts what was allocated before it.
// Prints a markdown table, then a breakdown of each case's time into GEMMs, attention and
// elementwise work. Usage: target_forward [--runs N] [--tokens T]
// [--model qwen3-8b|qwen3-30b-a3b|qwen3.5-27b] [--scan_only 1] [--profile 1]
//
// --profile 1: after each case's timed forwards, one more forward under the kernel profiler
// (common/device/kernel_profile.h): device ms by category (gemm, attention, elementwise/other,
// copy), busy against wall (the host's share: wall minus busy) and the 40 longest kernels, as a
// table on stderr. The profiled forward is not in the timed median.
//
// --model qwen3-30b-a3b: Qwen/Qwen3-30B-A3B's shape (48 layers, H=2048, 32/4 heads,
// 128 experts of I=768, top 8 renormalized; layer ids [1, 12, 23, 34, 45], so layers 0..45 run)
// with random bf16 weights, the experts drawn stacked (transformers 5's layout, loaded without a
// copy). Model TFLOP/s then counts the active parameters: attention, the router and the 8 chosen
// experts per token. No breakdown.
//
// --model qwen3.5-27b: Qwen/Qwen3.5-27B's text backbone (64 layers, H=5120, every
// fourth layer gated full attention with 24/4 heads of 256 and a quarter of RoPE, the others gated
// delta-rule layers with 16 key / 48 value heads of 128, I=17408; layer ids [1, 16, 31, 46, 61],
// so layers 0..61 run) with random bf16 weights. Model TFLOP/s counts the GEMMs and the full
// attention; the delta-rule scan itself (about 1% of the FLOPs) is not counted. No breakdown.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/device/kernel_profile.h"
#include "common/model/hf_config.h"
#include "common/nn/attention.h"
#include "common/nn/builtin_target.h"
#include "common/nn/gated_delta.h"
#include "common/nn/layers.h"
#include "common/nn/target_model.h"
#include "scripts/bench/bench_flags.h"

namespace dflash::nn {
namespace {

// Qwen/Qwen3-8B's config.json, less the fields dflash ignores.
constexpr const char* kQwen3_8B = R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
  "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000, "tie_word_embeddings": false, "max_position_embeddings": 40960})";

// Qwen/Qwen3-30B-A3B's config.json, less the fields dflash ignores.
constexpr const char* kQwen3_30B_A3B = R"({"model_type": "qwen3_moe",
  "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
  "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
  "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
  "moe_intermediate_size": 768, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000,
  "tie_word_embeddings": false, "max_position_embeddings": 40960})";

// Qwen/Qwen3.5-27B's text_config, less the fields dflash ignores.
constexpr const char* kQwen35_27B = R"({"model_type": "qwen3_5_text", "vocab_size": 248320,
  "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
  "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
  "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
  "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                      "partial_rotary_factor": 0.25}, "tie_word_embeddings": false})";

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// splitmix64, so that target_forward_hf.py draws the same document lengths.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Lengths in [100, 2000] summing to `total`: each draw is 100 + x % 1901; when the rest would fall
// under 100, the draw takes the rest (if that stays <= 2000) or leaves exactly 100.
std::vector<int64_t> MixLengths(int64_t total, uint64_t seed) {
  std::vector<int64_t> lengths;
  for (int64_t rest = total; rest > 0;) {
    int64_t n = 100 + static_cast<int64_t>(SplitMix64(&seed) % 1901);
    if (rest - n < 100) n = rest <= 2000 ? rest : rest - 100;
    lengths.push_back(n);
    rest -= n;
  }
  return lengths;
}

// Random weights under HF names for layers 0..num_layers-1, on the GPU in bf16
// (nn::RandomQwen3Weights: matrices N(0, 1/in), norms 1, embeddings N(0, 1)).
std::map<std::string, at::Tensor> RandomWeights(const model::TransformerConfig& c,
                                                int64_t num_layers) {
  const auto opt = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  return nn::RandomQwen3Weights(
      c, num_layers, [&](at::IntArrayRef shape) { return at::randn(shape, opt); }, opt,
      std::sqrt(static_cast<double>(c.hidden_size)));
}

// A Qwen3-MoE target's random weights (stacked experts), as RandomWeights draws a dense one.
std::map<std::string, at::Tensor> RandomMoeWeights(const model::TransformerConfig& c,
                                                   int64_t num_layers) {
  const auto opt = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const int64_t h = c.hidden_size, d = c.head_dim, e = c.num_experts;
  const int64_t mi = c.moe_intermediate_size;
  const int64_t q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  auto matrix = [&](std::vector<int64_t> shape) {
    const double in = static_cast<double>(shape.back());
    return at::randn(shape, opt).div_(std::sqrt(in));
  };
  std::map<std::string, at::Tensor> w;
  w["model.embed_tokens.weight"] = at::randn({c.vocab_size, h}, opt);
  w["lm_head.weight"] = matrix({c.vocab_size, h});
  w["model.norm.weight"] = at::ones({h}, opt);
  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    w[p + "input_layernorm.weight"] = at::ones({h}, opt);
    w[p + "post_attention_layernorm.weight"] = at::ones({h}, opt);
    w[p + "self_attn.q_norm.weight"] = at::ones({d}, opt);
    w[p + "self_attn.k_norm.weight"] = at::ones({d}, opt);
    w[p + "self_attn.q_proj.weight"] = matrix({q, h});
    w[p + "self_attn.k_proj.weight"] = matrix({kv, h});
    w[p + "self_attn.v_proj.weight"] = matrix({kv, h});
    w[p + "self_attn.o_proj.weight"] = matrix({h, q});
    w[p + "mlp.gate.weight"] = matrix({e, h});
    w[p + "mlp.experts.gate_up_proj"] = matrix({e, 2 * mi, h});
    w[p + "mlp.experts.down_proj"] = matrix({e, h, mi});
  }
  return w;
}

// A Qwen3.5 text backbone's random weights on the GPU in bf16 (nn::RandomHybridWeights).
std::map<std::string, at::Tensor> RandomHybridWeights(const model::TransformerConfig& c,
                                                      int64_t num_layers) {
  return nn::RandomHybridWeights(c, num_layers,
                                 at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
}

// Model FLOPs of one forward: 2 per multiply-add of the four GEMMs of each run layer (for a MoE
// layer: the router and the chosen experts' three), plus causal attention (q k^T and p v over
// n^2/2 pairs per document: 2 * n^2 * D * Hq per layer).
double ForwardFlops(const model::TransformerConfig& c, int64_t layers,
                    const std::vector<int64_t>& lengths) {
  const double h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const double hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  const double mlp_params =
      c.num_experts > 0
          ? h * c.num_experts + 3.0 * h * c.moe_intermediate_size * c.num_experts_per_tok
          : 3 * h * inter;
  const double gemm_params = h * (hq + 2 * hkv) * d + hq * d * h + mlp_params;
  double tokens = 0, pairs = 0;
  for (int64_t n : lengths) {
    tokens += n;
    pairs += static_cast<double>(n) * n;
  }
  if (!model::IsHybrid(c)) return layers * (2 * gemm_params * tokens + 2 * pairs * d * hq);
  // Hybrid: full-attention layers have a gated q_proj (2 Hq D rows); delta-rule layers project to
  // q, k, v, z, b, a and back.
  const double vd = c.linear_num_value_heads * c.linear_value_head_dim;
  const double cd = 2.0 * c.linear_num_key_heads * c.linear_key_head_dim + vd;
  const double linear_params = h * (cd + vd + 2 * c.linear_num_value_heads) + vd * h + mlp_params;
  const double full_params = gemm_params + h * hq * d;
  double flops = 0;
  for (int64_t i = 0; i < layers; ++i) {
    flops += model::IsLinearAttentionLayer(c, i) ? 2 * linear_params * tokens
                                                 : 2 * full_params * tokens + 2 * pairs * d * hq;
  }
  return flops;
}

// Median milliseconds of `runs` calls of `fn` (after 2 warm-ups), each followed by a synchronize.
double MedianMs(int runs, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int i = 0; i < runs + 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    c10::cuda::device_synchronize();
    const auto end = std::chrono::steady_clock::now();
    if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Case {
  std::string name;
  std::vector<int64_t> lengths;
};

struct Batch {
  at::Tensor input_ids, positions, cu_seqlens;  // on the GPU
};

Batch MakeBatch(const std::vector<int64_t>& lengths, int64_t vocab) {
  const auto gpu = at::TensorOptions().device(at::kCUDA);
  std::vector<at::Tensor> positions;
  std::vector<int32_t> cu = {0};
  for (int64_t n : lengths) {
    positions.push_back(at::arange(n, gpu.dtype(at::kLong)));
    cu.push_back(cu.back() + static_cast<int32_t>(n));
  }
  Batch b;
  b.input_ids = at::randint(vocab, {cu.back()}, gpu.dtype(at::kLong));
  b.positions = at::cat(positions);
  b.cu_seqlens = at::tensor(cu, at::TensorOptions().dtype(at::kInt)).to(at::kCUDA);
  return b;
}

int64_t AllocatedBytes(bool peak) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const auto& s =
      stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return peak ? s.peak : s.current;
}

// One table row: median milliseconds per forward, tokens/s, model TFLOP/s, peak GiB (total and
// above what was allocated before the case: weights, inputs and the features buffer).
bool RunCase(const TargetModel& model, const Case& c, int runs, bool profile) {
  const Batch batch = MakeBatch(c.lengths, model.config().vocab_size);
  at::Tensor features = at::empty({batch.input_ids.size(0), model.feature_dim()},
                                  at::TensorOptions().dtype(model.dtype()).device(model.device()));
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  const int64_t base = AllocatedBytes(false);
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  absl::Status status;
  const double ms = MedianMs(runs, [&] {
    if (status.ok()) {
      status = model.Forward(batch.input_ids, batch.positions, batch.cu_seqlens, features);
    }
  });
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name.c_str(), status.ToString().c_str());
    return false;
  }
  const int64_t tokens = batch.input_ids.size(0);
  const int64_t peak = AllocatedBytes(true);
  const int64_t layers = *std::max_element(model.layer_ids().begin(), model.layer_ids().end()) + 1;
  const double tflops = ForwardFlops(model.config(), layers, c.lengths) / (ms / 1000.0) / 1e12;
  std::printf("| dflash packed | %s | %zu | %ld | %.1f | %.0f | %.0f | %.2f | %.2f |\n",
              c.name.c_str(), c.lengths.size(), static_cast<long>(tokens), ms,
              tokens / (ms / 1000.0), tflops, peak / kGiB, (peak - base) / kGiB);
  std::fflush(stdout);
  if (!profile) return true;
  absl::StatusOr<device::KernelProfile> p = device::ProfileKernels([&] {
    if (status.ok())
      status = model.Forward(batch.input_ids, batch.positions, batch.cu_seqlens, features);
    c10::cuda::device_synchronize();
  });
  if (!p.ok() || !status.ok()) {
    std::fprintf(stderr, "%s: profile: %s %s\n", c.name.c_str(), p.status().ToString().c_str(),
                 status.ToString().c_str());
    return false;
  }
  std::fprintf(stderr, "%s\n", device::ProfileTable("target forward, " + c.name, *p, 40).c_str());
  return true;
}

// Where a forward's time goes: the same operations as TargetModel::RunLayer, `layers` times, on
// random tensors of the case's shapes, timed in three groups. GEMMs: the fused qkv, o_proj, fused
// gate_up and down projections. Attention: VarlenCausalAttention over the case's documents.
// Elementwise: the 2 RMSNorms (input, post-attention), the per-head q and k norms with RoPE
// (NormRope: the model's path, on q and k inside a qkv-shaped buffer), silu(gate) * up and the 2
// residual adds.
void Breakdown(const model::TransformerConfig& c, int64_t layers, const Case& cs, int runs) {
  const auto opt = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  const Batch batch = MakeBatch(cs.lengths, c.vocab_size);
  const int64_t t = batch.input_ids.size(0);
  const VarlenDocs docs = VarlenDocs::FromCuSeqlens(batch.cu_seqlens, batch.cu_seqlens.device());
  c10::InferenceMode inference;
  at::Tensor x = at::randn({t, h}, opt), act = at::randn({t, inter}, opt);
  at::Tensor qkv_w = at::randn({(hq + 2 * hkv) * d, h}, opt), o_w = at::randn({h, hq * d}, opt);
  at::Tensor gate_up_w = at::randn({2 * inter, h}, opt), down_w = at::randn({h, inter}, opt);
  at::Tensor q = at::randn({t, hq, d}, opt), k = at::randn({t, hkv, d}, opt);
  at::Tensor v = at::randn({t, hkv, d}, opt), gate_up = at::randn({t, 2 * inter}, opt);
  const at::Tensor qkv = at::randn({t, (hq + 2 * hkv) * d}, opt);
  const at::Tensor q_in = qkv.narrow(1, 0, hq * d).view({t, hq, d});
  const at::Tensor k_in = qkv.narrow(1, hq * d, hkv * d).view({t, hkv, d});
  at::Tensor norm_h = at::ones({h}, opt), norm_d = at::ones({d}, opt);
  const RopeTables rope =
      MakeRopeTables(batch.positions, RopeInvFreq(c).to(at::kCUDA), at::kBFloat16);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto repeat = [&](const std::function<void()>& layer) {
    return MedianMs(runs, [&] {
      for (int64_t i = 0; i < layers; ++i) layer();
    });
  };
  const double gemm = repeat([&] {
    Linear(x, qkv_w);
    Linear(x, o_w);
    Linear(x, gate_up_w);
    Linear(act, down_w);
  });
  const double attention = repeat([&] { VarlenCausalAttention(q, k, v, docs, scale); });
  const double elementwise = repeat([&] {
    RmsNorm(x, norm_h, c.rms_norm_eps);
    RmsNorm(x, norm_h, c.rms_norm_eps);
    NormRope(q_in, norm_d, c.rms_norm_eps, rope);  // fused unless DFLASH_FUSED_QK_NORM_ROPE=0
    NormRope(k_in, norm_d, c.rms_norm_eps, rope);
    SwiGluHalves(gate_up);  // the model's path (fused on CUDA unless DFLASH_FUSED_SWIGLU=0)
    x + x;
    x + x;
  });
  std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", cs.name.c_str(), gemm, attention, elementwise,
              gemm + attention + elementwise);
  std::fflush(stdout);
}

// A hybrid target's delta-rule scan alone (GatedDeltaRuleChunked on random bf16 inputs of one
// layer's shape), per case: how much of a forward the scan takes.
void ScanTime(const model::TransformerConfig& c, const Case& cs, int runs, int64_t layers) {
  const auto opt = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const Batch batch = MakeBatch(cs.lengths, c.vocab_size);
  const VarlenDocs docs = VarlenDocs::FromCuSeqlens(batch.cu_seqlens, batch.cu_seqlens.device());
  const int64_t t = batch.input_ids.size(0), hv = c.linear_num_value_heads;
  const at::Tensor q = at::randn({t, hv, c.linear_key_head_dim}, opt);
  const at::Tensor k = at::randn({t, hv, c.linear_key_head_dim}, opt);
  const at::Tensor v = at::randn({t, hv, c.linear_value_head_dim}, opt);
  const at::Tensor g = -2.0 * at::rand({t, hv}, opt.dtype(at::kFloat));
  const at::Tensor beta = at::rand({t, hv}, opt);
  c10::InferenceMode inference;
  int64_t linear = 0;
  for (int64_t i = 0; i < layers; ++i) linear += model::IsLinearAttentionLayer(c, i) ? 1 : 0;
  for (bool fused : {true, false}) {
    const double ms =
        MedianMs(runs, [&] { GatedDeltaRuleChunked(q, k, v, g, beta, docs, 64, fused); });
    std::printf("| %s | %s | %.2f | %ld | %.1f |\n", cs.name.c_str(),
                fused ? "kernel" : "step loop", ms, static_cast<long>(linear),
                ms * static_cast<double>(linear));
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  bench::RequireKnownFlags(
      argc, argv, {"--runs", "--tokens", "--model", "--scan_only", "--profile"}, "target_forward");
  const int runs = static_cast<int>(bench::Flag(argc, argv, "--runs", 7));
  const int64_t tokens = bench::Flag(argc, argv, "--tokens", 8192);
  const std::string model_name = bench::StrFlag(argc, argv, "--model", "qwen3-8b");
  // qwen3.5-27b: only the delta-rule scan table (no weights drawn)
  const bool scan_only = bench::Flag(argc, argv, "--scan_only", 0) != 0;
  const bool profile = bench::Flag(argc, argv, "--profile", 0) != 0;
  if (model_name != "qwen3-8b" && model_name != "qwen3-30b-a3b" && model_name != "qwen3.5-27b") {
    std::fprintf(stderr,
                 "target_forward: --model must be qwen3-8b, qwen3-30b-a3b or qwen3.5-27b\n");
    return 2;
  }
  const bool moe = model_name == "qwen3-30b-a3b";
  const bool hybrid = model_name == "qwen3.5-27b";
  if (at::getNumGPUs() == 0) {
    std::fprintf(stderr, "target_forward: no CUDA device\n");
    return 1;
  }
  auto config = moe      ? model::ParseHfConfig(kQwen3_30B_A3B, "Qwen3-30B-A3B")
                : hybrid ? model::ParseHfConfig(kQwen35_27B, "Qwen3.5-27B")
                         : model::ParseHfConfig(kQwen3_8B, "Qwen3-8B");
  if (!config.ok()) return std::fprintf(stderr, "%s\n", config.status().ToString().c_str()), 1;
  TargetModelOptions options;
  options.layer_ids = moe      ? std::vector<int64_t>{1, 12, 23, 34, 45}
                      : hybrid ? std::vector<int64_t>{1, 16, 31, 46, 61}
                               : std::vector<int64_t>{1, 9, 17, 25, 33};
  options.device = c10::Device(c10::kCUDA, 0);
  const std::vector<int64_t> mix = MixLengths(tokens, 1234);
  const std::vector<Case> cases = {{"mix 100-2000", mix},
                                   {"4 docs", std::vector<int64_t>(4, tokens / 4)},
                                   {"64 docs", std::vector<int64_t>(64, tokens / 64)},
                                   {"1 doc", {tokens}}};
  const int64_t layers = options.layer_ids.back() + 1;
  auto scan_table = [&] {
    std::printf(
        "\ndelta-rule scan alone (chunked, 64-row chunks, bf16 in, fp32 state)\n\n"
        "| case | recurrence | ms per layer | linear layers run | ms per forward |\n"
        "|---|---|---|---|---|\n");
    for (const Case& c : cases) ScanTime(*config, c, runs, layers);
  };
  if (hybrid && scan_only) {
    scan_table();
    return 0;
  }
  absl::StatusOr<std::unique_ptr<TargetModel>> model;
  {
    at::manual_seed(0);
    const int64_t run_layers = options.layer_ids.back() + 1;
    const std::map<std::string, at::Tensor> weights = moe ? RandomMoeWeights(*config, run_layers)
                                                      : hybrid
                                                          ? RandomHybridWeights(*config, run_layers)
                                                          : RandomWeights(*config, run_layers);
    model = TargetModel::FromTensors(*config, weights, options);
  }  // the unfused q/k/v and gate/up copies go with `weights`
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().ToString().c_str()), 1;

  std::printf("model: %s, layers 0..%ld\n", model_name.c_str(),
              static_cast<long>(options.layer_ids.back()));
  std::printf("mix lengths: %s\n", absl::StrJoin(mix, " ").c_str());
  std::printf("weights: %.2f GiB allocated\n\n", AllocatedBytes(false) / kGiB);
  std::printf(
      "| impl | case | docs | tokens | median ms | tokens/s | model TFLOP/s | peak GiB | "
      "peak above weights GiB |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    if (!RunCase(**model, c, runs, profile)) return 1;
  }
  if (hybrid) scan_table();
  if (moe || hybrid) return 0;  // the breakdown times the dense layer's operations
  std::printf(
      "\nbreakdown, ms per forward (%ld layers of the same operations on random tensors)"
      "\n\n| case | GEMMs | attention | norms, rope, elementwise | sum |\n"
      "|---|---|---|---|---|\n",
      static_cast<long>(layers));
  for (const Case& c : cases) Breakdown(*config, layers, c, runs);
  return 0;
}

}  // namespace
}  // namespace dflash::nn

int main(int argc, char** argv) { return dflash::nn::Main(argc, argv); }

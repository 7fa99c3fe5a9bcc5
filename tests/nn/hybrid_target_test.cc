// Hybrid linear-attention targets: CPU parity with transformers 5 on tiny random
// Qwen3.5 and Qwen3.5-MoE vision-language checkpoints written by hf_qwen3_5_oracle.py (their text
// backbone), the text-only form of the same weights, and the gated delta rule's chunked scan and
// convolution against their references on packed, ragged documents. Qwen3-Next's parity test is
// in target_model_test.cc (its oracle runs under the pinned transformers 4.57).
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/conv1d.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "common/drafter/drafter_model.h"
#include "common/model/hf_config.h"
#include "common/nn/builtin_target.h"
#include "common/nn/gated_delta.h"
#include "common/nn/generate.h"
#include "common/nn/target_model.h"
#include "common/spec/speculative.h"
#include "nlohmann/json.hpp"
#include "tests/common/read_file.h"
#include "tests/nn/oracle.h"
#include "tests/nn/proposers.h"

namespace dflash::nn {
namespace {

namespace fs = std::filesystem;
using oracle::ReadAll;
using oracle::RelError;
using oracle::ToVector;

class HybridTargetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { *oracle_error_ = oracle::GenerateQwen35OracleOutputs(); }
  void SetUp() override { ASSERT_TRUE(oracle_error_->empty()) << *oracle_error_; }
  static fs::path Dir() { return oracle::Qwen35OracleDir(); }

  static TargetModelOptions Fp32() {
    TargetModelOptions options;
    options.layer_ids = {0, 1, 2, 3, 4};
    options.dtype = at::kFloat;
    return options;
  }

  // <family> loaded to generate (fp32, every layer, the final norm and lm_head).
  static absl::StatusOr<std::unique_ptr<TargetModel>> LoadFull(const std::string& family) {
    TargetModelOptions options = Fp32();
    options.full = true;
    return TargetModel::Load((Dir() / family).string(), options);
  }

  // Every captured layer of `model` against <family>_refs.safetensors.
  static void ExpectMatchesRefs(const TargetModel& model, const std::string& family) {
    auto refs = ReadAll(Dir() / (family + "_refs.safetensors"));
    ASSERT_EQ(model.layer_ids(), ToVector(refs["layer_ids"]));
    auto features = model.Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
    ASSERT_TRUE(features.ok()) << features.status();
    ASSERT_EQ(features->sizes(), refs["features"].sizes());
    const int64_t h = model.config().hidden_size;
    for (size_t slot = 0; slot < model.layer_ids().size(); ++slot) {
      const double err =
          RelError(features->narrow(1, slot * h, h), refs["features"].narrow(1, slot * h, h));
      std::printf("%s layer %ld: max relative error %.3g\n", family.c_str(),
                  static_cast<long>(model.layer_ids()[slot]), err);
      EXPECT_LT(err, 1e-4) << family << " layer " << model.layer_ids()[slot];
    }
  }

  static std::string* oracle_error_;
};

std::string* HybridTargetTest::oracle_error_ = new std::string;

TEST_F(HybridTargetTest, Qwen35MatchesTransformers) {
  auto model = TargetModel::Load((Dir() / "qwen3_5").string(), Fp32());
  ASSERT_TRUE(model.ok()) << model.status();
  const model::TransformerConfig& c = (*model)->config();
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_EQ(model::RotaryDim(c), 8);
  EXPECT_TRUE(model::IsLinearAttentionLayer(c, 0));
  EXPECT_FALSE(model::IsLinearAttentionLayer(c, 2));
  ExpectMatchesRefs(**model, "qwen3_5");
}

TEST_F(HybridTargetTest, Qwen35MoeMatchesTransformers) {
  auto model = TargetModel::Load((Dir() / "qwen3_5_moe").string(), Fp32());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().shared_expert_intermediate_size, 48);
  EXPECT_TRUE((*model)->config().norm_topk_prob);
  ExpectMatchesRefs(**model, "qwen3_5_moe");
}

// The text-only form (model_type qwen3_5_text, tensors under model.*) of the same weights is the
// same model.
TEST_F(HybridTargetTest, TextOnlyCheckpointOfTheSameWeightsIsTheSameModel) {
  const nlohmann::json full =
      nlohmann::json::parse(dflash::testing::ReadFileText((Dir() / "qwen3_5" / "config.json")));
  nlohmann::json text = full.at("text_config");
  text["model_type"] = "qwen3_5_text";
  auto config = model::ParseHfConfig(text.dump(), "text config");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->weight_prefix, "model.");
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, t] : ReadAll(Dir() / "qwen3_5" / "model.safetensors")) {
    if (absl::StartsWith(name, "model.visual.")) continue;
    tensors[absl::StrReplaceAll(name, {{"model.language_model.", "model."}})] = t;
  }
  auto model = TargetModel::FromTensors(*config, tensors, Fp32());
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectMatchesRefs(**model, "qwen3_5");
}

// Generation with a hybrid target (target_decode.cc, GatedDeltaNetExtend): a sequence extended in
// pieces (a prefill, a decoding step, a block) gives the rows of one extension over the whole
// sequence and the features of the packed forward (whose captured layers match transformers: the
// test above), for the linear-attention layers' conv rows and recurrent state as for the
// attention layers' keys and values; two sequences of different lengths in one call, then a
// decoding step of both, as each alone; a truncation that would roll the state back is refused,
// one to 0 starts the sequence afresh.
TEST_F(HybridTargetTest, CachedStepsMatchOneForwardOverTheWholeSequence) {
  const std::vector<int64_t> seq = {3, 17, 200, 5, 9, 41, 41, 7, 128, 64, 2};
  const int64_t t = static_cast<int64_t>(seq.size());
  for (const std::string family : {"qwen3_5", "qwen3_5_moe"}) {
    auto model = LoadFull(family);
    ASSERT_TRUE(model.ok()) << model.status();
    auto whole_cache = KvCache::Create(**model, 1, 16);
    ASSERT_TRUE(whole_cache.ok()) << whole_cache.status();
    auto whole = (*model)->Extend({0}, {seq}, whole_cache->get(), true);
    ASSERT_TRUE(whole.ok()) << whole.status();
    auto packed = (*model)->Forward(at::tensor(seq, at::kLong), at::arange(t, at::kLong),
                                    at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(t)},
                                               at::TensorOptions().dtype(at::kInt)));
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_LT(RelError(whole->features, *packed), 1e-4) << family;

    auto cache = KvCache::Create(**model, 2, 16);
    ASSERT_TRUE(cache.ok());
    std::vector<at::Tensor> hidden, features;
    size_t at = 0;
    for (size_t n : {4, 1, 6}) {
      std::vector<int64_t> part(seq.begin() + at, seq.begin() + at + n);
      auto out = (*model)->Extend({1}, {part}, cache->get(), true);
      ASSERT_TRUE(out.ok()) << out.status();
      hidden.push_back(out->hidden);
      features.push_back(out->features);
      at += n;
    }
    EXPECT_LT(RelError(at::cat(hidden), whole->hidden), 1e-5) << family;
    EXPECT_LT(RelError(at::cat(features), whole->features), 1e-5) << family;

    // A rollback is refused, state untouched; back to 0 starts afresh.
    const absl::Status back = (*cache)->Truncate(1, 5);
    EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition) << back;
    EXPECT_EQ((*cache)->length(1), t);
    ASSERT_TRUE((*cache)->Truncate(1, 0).ok());
    // Two sequences of different lengths in one call (the prefill path), then a step of both.
    const std::vector<int64_t> other = {9, 41, 7};
    auto both = (*model)->Extend({0, 1}, {other, seq}, cache->get(), false);
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_LT(RelError(both->hidden.narrow(0, 3, t), whole->hidden), 1e-5) << family;
    auto step = (*model)->Extend({0, 1}, {{5}, {5}}, cache->get(), false);
    ASSERT_TRUE(step.ok()) << step.status();
    // A second step of both reads the conv rows and states the first one left.
    step = (*model)->Extend({0, 1}, {{9}, {9}}, cache->get(), false);
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<int64_t> longer = seq;
    longer.push_back(5);
    longer.push_back(9);
    auto alone_cache = KvCache::Create(**model, 1, 16);
    ASSERT_TRUE(alone_cache.ok());
    auto alone = (*model)->Extend({0}, {longer}, alone_cache->get(), false);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_LT(RelError(step->hidden.narrow(0, 1, 1), alone->hidden.narrow(0, t + 1, 1)), 1e-5)
        << family;
  }
}

// Speculative decoding with a hybrid target: each verification's rejected tokens are dropped from
// the recurrent states by going back to the states saved before it and running the kept tokens
// again, so the output is greedy decoding's, whatever the proposals (an untrained drafter: nearly
// every block has rejections; proposers right for 0, 2 or all B-1 slots, for every k); the
// acceptance counts what was kept.
TEST_F(HybridTargetTest, SpeculativeDecodingEqualsGreedyDecoding) {
  const std::vector<std::vector<int64_t>> prompts = {{3, 17, 200, 5, 9}, {41}, {7, 128, 64, 2}};
  constexpr int64_t kNew = 20, kBlock = 4;
  for (const std::string family : {"qwen3_5", "qwen3_5_moe"}) {
    auto model = LoadFull(family);
    ASSERT_TRUE(model.ok()) << model.status();
    GenerateOptions g;
    g.max_new_tokens = kNew;
    auto greedy = Generate(**model, prompts, g);
    ASSERT_TRUE(greedy.ok()) << greedy.status();
    std::vector<std::vector<int64_t>> want;
    for (const Generation& out : *greedy) want.push_back(out.tokens);
    spec::SpecDecodeOptions so;
    so.max_new_tokens = kNew;
    if ((*model)->config().intermediate_size > 0) {  // a dense MLP for the drafter to copy
      drafter::DrafterConfig config;
      config.target = (*model)->config();
      config.num_layers = 1;
      config.block_size = kBlock;
      config.mask_token_id = 1;
      config.target_layer_ids = (*model)->layer_ids();
      auto drafter = drafter::DrafterModel::Create(config, drafter::DrafterOptions(),
                                                   (*model)->embed_tokens(), (*model)->lm_head());
      ASSERT_TRUE(drafter.ok()) << drafter.status();
      auto untrained = spec::SpeculativeGenerate(**model, **drafter, prompts, so);
      ASSERT_TRUE(untrained.ok()) << untrained.status();
      EXPECT_EQ(untrained->tokens, want) << family;
      EXPECT_GT(untrained->replays, 0) << family;
    }
    for (int64_t right : {int64_t{0}, int64_t{2}, kBlock - 1}) {
      // Right for the first `right` slots of every block, wrong after.
      const spec::Proposer knowing = testing::KnowingProposer(prompts, want, kBlock, right);
      auto out = spec::SpeculativeGenerate(**model, kBlock, knowing, prompts, so);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->tokens, want) << family << " right " << right;
      if (right > 0) EXPECT_GT(out->stats.accepted, 0) << family;
      if (right == kBlock - 1) EXPECT_EQ(out->replays, 0) << family;  // every block kept whole
      if (right < kBlock - 1) EXPECT_GT(out->replays, 0) << family;
    }
  }
}

// nn::RandomHybridWeights (builtin:qwen3.5-27b-random's weights) under the names and shapes that
// the loader checks for a real Qwen3.5 text backbone (as the built-in parses Qwen3.5-27B's
// text_config): the oracle's tiny one, drawn on the CPU, loads with every layer and runs a finite
// forward, and reports the reference kernels it runs on the CPU.
TEST_F(HybridTargetTest, RandomHybridWeightsLoadAsTheConfigsModel) {
  for (const std::string family : {"qwen3_5"}) {
    const nlohmann::json j = nlohmann::json::parse(
        dflash::testing::ReadFileText((Dir() / family / "config.json").string()));
    auto config = model::ParseHfConfig(j.at("text_config").dump(), "text_config");
    ASSERT_TRUE(config.ok()) << config.status();
    at::manual_seed(3);
    TargetModelOptions o = Fp32();
    o.full = true;
    auto model =
        TargetModel::FromTensors(*config,
                                 RandomHybridWeights(*config, config->num_hidden_layers,
                                                     at::TensorOptions().dtype(at::kFloat)),
                                 o);
    ASSERT_TRUE(model.ok()) << model.status();
    const at::Tensor ids = at::arange(12, at::kLong);
    auto features =
        (*model)->Forward(ids, ids, at::tensor({0, 12}, at::TensorOptions().dtype(at::kInt)));
    ASSERT_TRUE(features.ok()) << features.status();
    EXPECT_TRUE(features->isfinite().all().item<bool>());
    // The start event's kernel report: on the CPU both kinds of layer run the references.
    int64_t linear = 0;
    for (int64_t i = 0; i < config->num_hidden_layers; ++i) {
      linear += model::IsLinearAttentionLayer(*config, i) ? 1 : 0;
    }
    ASSERT_GT(linear, 0);
    EXPECT_EQ((*model)->Kernels(), "attention: reference (the CPU); linear attention (" +
                                       std::to_string(linear) +
                                       " layers): gated delta rule, reference; mlp activation: "
                                       "silu and mul (ATen)");
  }
}

// Greedy generation with the cache equals greedy decoding that recomputes the whole sequence at
// every step (a fresh cache each time), batched, on both hybrid families.
TEST_F(HybridTargetTest, GreedyGenerationEqualsRecomputingTheWholeSequence) {
  const std::vector<std::vector<int64_t>> prompts = {{3, 17, 200, 5, 9}, {41}, {7, 128, 64, 2}};
  for (const std::string family : {"qwen3_5", "qwen3_5_moe"}) {
    auto model = LoadFull(family);
    ASSERT_TRUE(model.ok()) << model.status();
    GenerateOptions o;
    o.max_new_tokens = 8;
    auto generated = Generate(**model, prompts, o);
    ASSERT_TRUE(generated.ok()) << generated.status();
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int64_t> tokens = prompts[i];
      for (int step = 0; step < 8; ++step) {
        auto cache = KvCache::Create(**model, 1, 32);
        ASSERT_TRUE(cache.ok());
        auto out = (*model)->Extend({0}, {tokens}, cache->get(), false);
        ASSERT_TRUE(out.ok()) << out.status();
        auto logits = (*model)->Logits(out->hidden.narrow(0, out->hidden.size(0) - 1, 1));
        ASSERT_TRUE(logits.ok());
        tokens.push_back(logits->argmax(1).item<int64_t>());
      }
      const std::vector<int64_t> want(tokens.begin() + static_cast<int64_t>(prompts[i].size()),
                                      tokens.end());
      EXPECT_EQ((*generated)[i].tokens, want) << family << " prompt " << i;
    }
  }
}

VarlenDocs Docs(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  return VarlenDocs::FromCuSeqlens(at::tensor(cu, at::kInt), c10::Device(c10::DeviceType::CPU));
}

// Random delta-rule inputs for `t` rows, `hv` heads: g in [-2, 0], beta in (0, 1).
struct ScanInputs {
  at::Tensor q, k, v, g, beta;
  static ScanInputs Random(int64_t t, int64_t hv, int64_t dk, int64_t dv) {
    return {at::randn({t, hv, dk}), at::randn({t, hv, dk}), at::randn({t, hv, dv}),
            -2.0 * at::rand({t, hv}), at::rand({t, hv})};
  }
};

TEST(GatedDeltaRuleTest, ChunkedScanMatchesTheSequentialReference) {
  at::manual_seed(5);
  // Ragged documents: empty ones, single rows, exact and partial chunks, several chunks.
  const VarlenDocs docs = Docs({0, 1, 70, 64, 3, 0, 150, 17});
  ScanInputs in = ScanInputs::Random(docs.offsets.back(), 3, 16, 8);
  const at::Tensor want = GatedDeltaRuleReference(in.q, in.k, in.v, in.g, in.beta, docs);
  for (int64_t chunk : {64, 16, 4, 1}) {
    const at::Tensor got = GatedDeltaRuleChunked(in.q, in.k, in.v, in.g, in.beta, docs, chunk);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LT(RelError(got, want), 1e-5) << "chunk " << chunk;
    EXPECT_FALSE(got.isnan().any().item<bool>());
  }
}

// GatedDeltaNetExtend's two forms from the same held conv rows and states: the chunked one (long
// extensions) gives the recurrent one's rows, conv rows and states, for sequences of different
// lengths (one with no new rows, partial and several chunks) and then equal ones, continuing
// from what the first call left.
TEST(GatedDeltaRuleTest, ChunkedExtensionsContinueTheHeldStatesAsTheRecurrenceDoes) {
  at::manual_seed(8);
  GatedDeltaDims d;
  d.num_k_heads = 2;
  d.num_v_heads = 4;
  d.k_head_dim = 8;
  d.v_head_dim = 8;
  d.conv_kernel = 4;
  const int64_t h = 16, sequences = 4;
  GatedDeltaWeights w;
  w.in_proj = at::randn({d.in_proj_rows(), h}) * 0.3;
  w.conv = at::randn({d.conv_dim(), d.conv_kernel}) * 0.5;
  w.dt_bias = at::randn({d.num_v_heads}) * 0.5;
  w.a_log = at::rand({d.num_v_heads}) * 2 - 1;
  w.norm = at::rand({d.v_head_dim}) + 0.5;
  w.out_proj = at::randn({h, d.value_dim()}) * 0.3;
  at::Tensor conv_a = at::randn({sequences, d.conv_kernel - 1, d.conv_dim()});
  at::Tensor state_a = at::randn({sequences, d.num_v_heads, d.k_head_dim, d.v_head_dim}) * 0.3;
  at::Tensor conv_b = conv_a.clone(), state_b = state_a.clone();
  const struct {
    std::vector<int64_t> sequences, counts;
  } calls[] = {{{2, 1, 0, 3}, {70, 0, 5, 130}}, {{0, 2}, {40, 40}}};
  for (const auto& call : calls) {
    std::vector<int64_t> offsets = {0};
    for (int64_t c : call.counts) offsets.push_back(offsets.back() + c);
    const at::Tensor x = at::randn({offsets.back(), h});
    const at::Tensor chunked = GatedDeltaNetExtend(x, w, d, call.sequences, offsets, &conv_a,
                                                   &state_a, /*chunked_from=*/1);
    const at::Tensor recurrent = GatedDeltaNetExtend(x, w, d, call.sequences, offsets, &conv_b,
                                                     &state_b, /*chunked_from=*/1 << 30);
    EXPECT_LT(RelError(chunked, recurrent), 1e-5);
    EXPECT_LT(RelError(conv_a, conv_b), 1e-6);
    EXPECT_LT(RelError(state_a, state_b), 1e-5);
  }
}

TEST(GatedDeltaRuleTest, DocumentsDoNotSeeEachOther) {
  at::manual_seed(6);
  const VarlenDocs packed = Docs({40, 90});
  ScanInputs in = ScanInputs::Random(130, 2, 8, 8);
  const at::Tensor both = GatedDeltaRuleChunked(in.q, in.k, in.v, in.g, in.beta, packed);
  auto rows = [](const at::Tensor& t, int64_t b, int64_t n) { return t.narrow(0, b, n); };
  const at::Tensor second =
      GatedDeltaRuleChunked(rows(in.q, 40, 90), rows(in.k, 40, 90), rows(in.v, 40, 90),
                            rows(in.g, 40, 90), rows(in.beta, 40, 90), Docs({90}));
  EXPECT_LT(RelError(both.narrow(0, 40, 90), second), 1e-6);
}

TEST(GatedDeltaRuleTest, KeepsTheInputDtypeAndHandlesNoRows) {
  const VarlenDocs docs = Docs({5});
  ScanInputs in = ScanInputs::Random(5, 2, 4, 4);
  const at::Tensor got =
      GatedDeltaRuleChunked(in.q.to(at::kBFloat16), in.k.to(at::kBFloat16), in.v.to(at::kBFloat16),
                            in.g, in.beta.to(at::kBFloat16), docs);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  const VarlenDocs none = Docs({});
  ScanInputs empty = ScanInputs::Random(0, 2, 4, 4);
  EXPECT_EQ(GatedDeltaRuleChunked(empty.q, empty.k, empty.v, empty.g, empty.beta, none).size(0), 0);
}

TEST(GatedDeltaRuleTest, ConvolutionRestartsAtEachDocument) {
  at::manual_seed(7);
  const std::vector<int32_t> lengths = {1, 6, 2, 9};
  const VarlenDocs docs = Docs(lengths);
  const at::Tensor x = at::randn({18, 5}), w = at::randn({5, 4});
  const at::Tensor got = CausalConv1dVarlen(x, w, docs);
  int64_t begin = 0;
  for (int32_t n : lengths) {
    // transformers: F.conv1d(x[None].T, w[:, None], padding=K-1, groups=C)[..., :n].
    const at::Tensor doc = x.narrow(0, begin, n).t().unsqueeze(0);
    const at::Tensor want =
        at::conv1d(doc, w.unsqueeze(1), {}, 1, 3, 1, 5).narrow(2, 0, n).squeeze(0).t();
    EXPECT_LT(RelError(got.narrow(0, begin, n), want), 1e-6) << "document at " << begin;
    begin += n;
  }
}

}  // namespace
}  // namespace dflash::nn

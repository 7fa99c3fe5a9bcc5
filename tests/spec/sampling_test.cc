// Sampled speculative decoding (common/spec/sampling.h) with the built-in tiny Qwen3 target (fp32,
// CPU): the sampling distribution keeps top_k and top_p's tokens, and the lossless rule is tested
// statistically. Many sequences of one prompt decode
// together (each draws independently), and the empirical distribution of their first three
// tokens is held against the exact one, computed from the target's own probabilities, by a
// chi-square test at a false-failure probability of 1e-6 (Wilson-Hilferty approximation of the
// chi-square quantile). Three proposers: one that draws from a q overlapping p (some 15% of its
// proposals kept: acceptances and residual draws both by the thousand), one
// certain of its proposals, and the untrained DFlash drafter drawing from its own q (fewer draws:
// its forward over thousands of sequences is slow on the CPU). The same statistic against the
// distribution at another temperature is far above the bound: the test tells such close
// distributions apart.
//
// Built twice: sampling_test on the CPU (label unit) and, with DFLASH_SAMPLING_ON_CUDA,
// sampling_gpu_test with the target, the drafter, q and the sampler's generator on CUDA device 0
// (label gpu; skipped without a device).
#include "common/spec/sampling.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/tensor.h>
#include <c10/core/Device.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "common/drafter/drafter_model.h"
#include "common/nn/builtin_target.h"
#include "common/nn/generate.h"
#include "common/nn/target_model.h"
#include "common/spec/speculative.h"

namespace dflash::spec {
namespace {

#ifdef DFLASH_SAMPLING_ON_CUDA
const c10::Device kDevice(c10::DeviceType::CUDA, 0);
#else
const c10::Device kDevice(c10::DeviceType::CPU);
#endif

std::unique_ptr<nn::TargetModel> Target() {
  nn::TargetModelOptions options;
  options.dtype = at::kFloat;
  options.full = true;
  options.device = kDevice;
  auto target = nn::BuiltinTarget("tiny-qwen3", options);
  EXPECT_TRUE(target.ok()) << target.status();
  return target.ok() ? std::move(*target) : nullptr;
}

std::unique_ptr<drafter::DrafterModel> Drafter(const nn::TargetModel& target, int64_t block) {
  drafter::DrafterConfig config;
  config.target = target.config();
  config.num_layers = 1;
  config.block_size = block;
  config.mask_token_id = 1;
  config.target_layer_ids = target.layer_ids();
  drafter::DrafterOptions options;
  options.seed = 5;
  options.device = kDevice;
  auto d = drafter::DrafterModel::Create(config, options, target.embed_tokens(), target.lm_head());
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

// One intra-op thread: the decodes here are thousands of small operations on a tiny model, and
// ctest -j2 runs two such processes on CI's 2 cores; with two threads each the overlapping-q
// test went from 13 s alone to over 300 s there.
class SamplingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { at::set_num_threads(1); }
  void SetUp() override {
    if (kDevice.is_cuda() && at::getNumGPUs() == 0) {
      GTEST_SKIP() << "no CUDA device on this machine";
    }
  }
};

SamplingOptions Sampled(double temperature, int64_t top_k, uint64_t seed = 7) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.seed = seed;
  return o;
}

TEST_F(SamplingTest, TheDistributionKeepsTopKThenTopP) {
  // Probabilities at temperature 1: 0.4, 0.3, 0.2, 0.1 (as logits: their logs).
  const at::Tensor logits =
      at::tensor(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}).log().unsqueeze(0).to(kDevice);
  SamplingOptions o = Sampled(1, 0);
  at::Tensor p = nn::SamplingProbabilities(logits, o);
  EXPECT_NEAR(p[0][1].item<float>(), 0.3f, 1e-6);
  o.top_k = 2;
  p = nn::SamplingProbabilities(logits, o);
  EXPECT_NEAR(p[0][0].item<float>(), 0.4f / 0.7f, 1e-6);
  EXPECT_EQ(p[0][2].item<float>(), 0.0f);
  o.top_k = 0;
  o.top_p = 0.75;  // 0.4 + 0.3 < 0.75: the third token is needed to reach it
  p = nn::SamplingProbabilities(logits, o);
  EXPECT_NEAR(p[0][2].item<float>(), 0.2f / 0.9f, 1e-6);
  EXPECT_EQ(p[0][3].item<float>(), 0.0f);
  o.top_p = 0.1;  // the most likely token always stays
  p = nn::SamplingProbabilities(logits, o);
  EXPECT_EQ(p[0][0].item<float>(), 1.0f);
  o = Sampled(2, 0);  // temperature 2: p ~ sqrt of the probabilities
  p = nn::SamplingProbabilities(logits, o);
  const double z = std::sqrt(0.4) + std::sqrt(0.3) + std::sqrt(0.2) + std::sqrt(0.1);
  EXPECT_NEAR(p[0][3].item<float>(), std::sqrt(0.1) / z, 1e-6);
}

using Triple = std::vector<int64_t>;

// The exact probability of every sequence of the first three tokens under plain sampling.
std::map<Triple, double> ExactFirstThree(const nn::TargetModel& target,
                                         const std::vector<int64_t>& prompt,
                                         const SamplingOptions& o) {
  // The distribution after `prefix`, from one forward over prompt + prefix.
  auto next = [&](const std::vector<int64_t>& prefix) {
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), prefix.begin(), prefix.end());
    auto cache = nn::KvCache::Create(target, 1, static_cast<int64_t>(seq.size()));
    EXPECT_TRUE(cache.ok());
    auto out = target.Extend({0}, {seq}, cache->get(), false);
    EXPECT_TRUE(out.ok()) << out.status();
    auto logits = target.Logits(out->hidden.narrow(0, out->hidden.size(0) - 1, 1));
    EXPECT_TRUE(logits.ok());
    const at::Tensor p = nn::SamplingProbabilities(*logits, o).view({-1}).to(at::kCPU).contiguous();
    std::map<int64_t, double> support;
    for (int64_t t = 0; t < p.numel(); ++t) {
      if (p[t].item<float>() > 0) support[t] = p[t].item<float>();
    }
    return support;
  };
  std::map<Triple, double> exact;
  for (const auto& [a, pa] : next({})) {
    for (const auto& [b, pb] : next({a})) {
      for (const auto& [c, pc] : next({a, b})) exact[{a, b, c}] = pa * pb * pc;
    }
  }
  return exact;
}

// Pearson's statistic of `counts` (n draws) against `exact`, cells with expected counts below 5
// pooled into one; *df gets its degrees of freedom.
double ChiSquare(const std::map<Triple, int64_t>& counts, int64_t n,
                 const std::map<Triple, double>& exact, int* df) {
  double stat = 0, pooled_expected = 0;
  int64_t pooled_observed = 0, unexpected = 0;
  int cells = 0;
  for (const auto& [t, c] : counts) {
    if (!exact.count(t)) unexpected += c;  // impossible under plain sampling
  }
  for (const auto& [t, p] : exact) {
    const double e = p * static_cast<double>(n);
    const auto it = counts.find(t);
    const int64_t c = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pooled_expected += e;
      pooled_observed += c;
      continue;
    }
    stat += (c - e) * (c - e) / e;
    ++cells;
  }
  if (pooled_expected > 0) {
    stat +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  *df = cells - 1;
  return unexpected > 0 ? 1e30 : stat;
}

// The chi-square quantile for a false-failure probability of 1e-6 (z = 4.753).
double Bound(int df) {
  const double k = df, z = 4.753;
  return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
}

struct Draws {
  std::map<Triple, int64_t> counts;
  int64_t verifications = 0, accepted = 0;
};

Draws Decode(const nn::TargetModel& target, const drafter::DrafterModel* drafter,
             const Proposer* proposer, const SamplingProposer* sampling,
             const std::vector<int64_t>& prompt, int64_t n, const SamplingOptions& o) {
  SpecDecodeOptions options;
  options.max_new_tokens = 3;
  options.sampling = o;
  const std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(n), prompt);
  auto out = drafter != nullptr    ? SpeculativeGenerate(target, *drafter, prompts, options)
             : proposer != nullptr ? SpeculativeGenerate(target, 4, *proposer, prompts, options)
                                   : SpeculativeGenerate(target, 4, *sampling, prompts, options);
  EXPECT_TRUE(out.ok()) << out.status();
  Draws r;
  if (!out.ok()) return r;
  for (const std::vector<int64_t>& t : out->tokens) ++r.counts[t];
  r.verifications = out->stats.verifications;
  r.accepted = out->stats.accepted;
  return r;
}

const std::vector<int64_t> kPrompt = {20, 31, 99, 400, 17};
constexpr int64_t kDraws = 6000;

TEST_F(SamplingTest, SpeculativeSamplingWithAnOverlappingQIsDistributedAsPlainSampling) {
  auto target = Target();
  ASSERT_TRUE(target);
  const SamplingOptions o = Sampled(2.0, 4);
  const std::map<Triple, double> exact = ExactFirstThree(*target, kPrompt, o);
  // q: uniform over every token that plain sampling can emit in the first three positions (a
  // superset of each position's top 4), the same for every slot; proposals drawn from it.
  std::vector<int64_t> support;
  for (const auto& [t, p] : exact) support.insert(support.end(), t.begin(), t.end());
  std::sort(support.begin(), support.end());
  support.erase(std::unique(support.begin(), support.end()), support.end());
  const int64_t v = target->config().vocab_size;
  std::vector<float> uniform(static_cast<size_t>(v), 0.0f);
  for (int64_t t : support) uniform[t] = 1.0f / static_cast<float>(support.size());
  std::mt19937_64 rng(3);
  const SamplingProposer overlapping = [&](const std::vector<const DraftContext*>& contexts) {
    DraftBlocks d;
    const int64_t n = static_cast<int64_t>(contexts.size());
    for (int64_t j = 0; j < n; ++j) {
      d.tokens.emplace_back();
      for (int i = 0; i < 3; ++i) d.tokens.back().push_back(support[rng() % support.size()]);
    }
    d.q = at::tensor(uniform).view({1, 1, v}).expand({n, 3, v}).contiguous().to(kDevice);
    return absl::StatusOr<DraftBlocks>(std::move(d));
  };
  const Draws r = Decode(*target, nullptr, nullptr, &overlapping, kPrompt, kDraws, o);
  int df = 0;
  const double stat = ChiSquare(r.counts, kDraws, exact, &df);
  std::cerr << "[sampling_test] overlapping q: chi-square " << stat << " on " << df
            << " degrees of freedom (bound " << Bound(df) << "); " << r.accepted
            << " proposals kept in " << r.verifications << " verifications\n";
  ASSERT_GE(df, 10);
  EXPECT_LT(stat, Bound(df));
  // Both branches of the rule ran by the thousand (a verification checks up to 2 proposals here:
  // the third token ends the sequence).
  EXPECT_GT(r.accepted, 1000);
  EXPECT_LT(r.accepted, r.verifications - 1000);
  // Power: the same draws against the distribution at temperature 1.6.
  const double other =
      ChiSquare(r.counts, kDraws, ExactFirstThree(*target, kPrompt, Sampled(1.6, 4)), &df);
  std::cerr << "[sampling_test] against temperature 1.6: chi-square " << other << "\n";
  EXPECT_GT(other, 4 * Bound(df));
}

TEST_F(SamplingTest, SpeculativeSamplingWithTheDraftersQIsDistributedAsPlainSampling) {
  auto target = Target();
  auto drafter = Drafter(*target, 4);
  ASSERT_TRUE(target && drafter);
  const SamplingOptions o = Sampled(2.0, 4, 5);
  constexpr int64_t kFewer = 1500;
  const Draws r = Decode(*target, drafter.get(), nullptr, nullptr, kPrompt, kFewer, o);
  int df = 0;
  const double stat = ChiSquare(r.counts, kFewer, ExactFirstThree(*target, kPrompt, o), &df);
  std::cerr << "[sampling_test] the drafter's q: chi-square " << stat << " on " << df
            << " degrees of freedom (bound " << Bound(df) << "); " << r.accepted
            << " proposals kept in " << r.verifications << " verifications\n";
  ASSERT_GE(df, 5);
  EXPECT_LT(stat, Bound(df));
}

// A DFlash2 drafter (docs/method.md §2.2) drafts from its candidate selector: q is softmax(scores
// / temperature) over each slot's top-k candidates, zero elsewhere. Lossless all the same.
TEST_F(SamplingTest, SpeculativeSamplingWithADflash2SelectorIsDistributedAsPlainSampling) {
  auto target = Target();
  ASSERT_TRUE(target);
  drafter::DrafterConfig config;
  config.target = target->config();
  config.num_layers = 1;
  config.block_size = 4;
  config.mask_token_id = 1;
  config.target_layer_ids = target->layer_ids();
  config.conv_kernel_size = 2;
  config.conv_group_size = 8;
  config.selector_rank = 8;
  config.selector_top_k = 6;
  drafter::DrafterOptions options;
  options.seed = 5;
  options.init_std = 0.2;  // a selector that moves the candidates' order
  options.device = kDevice;
  auto drafter =
      drafter::DrafterModel::Create(config, options, target->embed_tokens(), target->lm_head());
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const SamplingOptions o = Sampled(2.0, 4, 7);
  constexpr int64_t kFewer = 1500;
  const Draws r = Decode(*target, drafter->get(), nullptr, nullptr, kPrompt, kFewer, o);
  int df = 0;
  const double stat = ChiSquare(r.counts, kFewer, ExactFirstThree(*target, kPrompt, o), &df);
  std::cerr << "[sampling_test] a DFlash2 selector's q: chi-square " << stat << " on " << df
            << " degrees of freedom (bound " << Bound(df) << "); " << r.accepted
            << " proposals kept in " << r.verifications << " verifications\n";
  ASSERT_GE(df, 5);
  EXPECT_LT(stat, Bound(df));
  EXPECT_GT(r.accepted, 0);
}

TEST_F(SamplingTest, SpeculativeSamplingWithCertainProposalsIsDistributedAsPlainSampling) {
  auto target = Target();
  ASSERT_TRUE(target);
  // Always the same proposals (some right, mostly wrong): kept with probability p(x).
  const Proposer fixed = [](const std::vector<const DraftContext*>& contexts) {
    return absl::StatusOr<std::vector<std::vector<int64_t>>>(
        std::vector<std::vector<int64_t>>(contexts.size(), {17, 99, 31}));
  };
  const SamplingOptions o = Sampled(2.0, 4, 11);
  const Draws r = Decode(*target, nullptr, &fixed, nullptr, kPrompt, kDraws, o);
  int df = 0;
  const double stat = ChiSquare(r.counts, kDraws, ExactFirstThree(*target, kPrompt, o), &df);
  std::cerr << "[sampling_test] certain proposals: chi-square " << stat << " on " << df
            << " degrees of freedom (bound " << Bound(df) << ")\n";
  ASSERT_GE(df, 10);
  EXPECT_LT(stat, Bound(df));
}

TEST_F(SamplingTest, OneSeedGivesOneOutputAndAnotherSeedAnother) {
  auto target = Target();
  auto drafter = Drafter(*target, 4);
  ASSERT_TRUE(target && drafter);
  const std::vector<std::vector<int64_t>> prompts(8, kPrompt);
  // Settings are checked (nn::ValidateSampling, as plain generation's), naming the field.
  auto decode = [&](uint64_t seed) {
    SpecDecodeOptions options;
    options.max_new_tokens = 12;
    options.sampling = Sampled(1.5, 0, seed);
    auto out = SpeculativeGenerate(*target, *drafter, prompts, options);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->tokens : std::vector<std::vector<int64_t>>{};
  };
  EXPECT_EQ(decode(3), decode(3));
  EXPECT_NE(decode(3), decode(4));
  SpecDecodeOptions bad;
  bad.sampling = Sampled(-1, 0);
  const absl::Status refused = SpeculativeGenerate(*target, *drafter, prompts, bad).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("temperature -1"), std::string::npos) << refused;
}

}  // namespace
}  // namespace dflash::spec

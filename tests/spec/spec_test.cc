// Speculative decoding with the built-in tiny Qwen3 target (fp32, CPU): the output equals plain
// greedy decoding whatever the proposals are (an untrained DFlash drafter, proposers right for a
// given number of slots), and the acceptance statistics count exactly what was accepted.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/drafter/drafter_model.h"
#include "common/nn/builtin_target.h"
#include "common/nn/generate.h"
#include "common/nn/target_model.h"
#include "common/spec/speculative.h"

namespace dflash::spec {
namespace {

std::unique_ptr<nn::TargetModel> Target() {
  nn::TargetModelOptions options;
  options.dtype = at::kFloat;
  options.full = true;
  auto target = nn::BuiltinTarget("tiny-qwen3", options);
  EXPECT_TRUE(target.ok()) << target.status();
  return target.ok() ? std::move(*target) : nullptr;
}

std::unique_ptr<drafter::DrafterModel> Drafter(const nn::TargetModel& target, int64_t block_size,
                                               std::vector<int64_t> layer_ids = {}) {
  drafter::DrafterConfig config;
  config.target = target.config();
  config.num_layers = 1;
  config.block_size = block_size;
  config.mask_token_id = 1;
  config.target_layer_ids = layer_ids.empty() ? target.layer_ids() : layer_ids;
  drafter::DrafterOptions options;
  options.seed = 5;
  auto d = drafter::DrafterModel::Create(config, options, target.embed_tokens(), target.lm_head());
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

const std::vector<std::vector<int64_t>> kPrompts = {
    {20, 31, 99, 400, 17}, {300}, {45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56}};

std::vector<std::vector<int64_t>> Greedy(const nn::TargetModel& target,
                                         const std::vector<std::vector<int64_t>>& prompts,
                                         int64_t max_new_tokens, std::vector<int64_t> stops = {}) {
  nn::GenerateOptions options;
  options.max_new_tokens = max_new_tokens;
  options.stop_token_ids = std::move(stops);
  auto out = nn::Generate(target, prompts, options);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<std::vector<int64_t>> tokens;
  if (out.ok()) {
    for (const nn::Generation& g : *out) tokens.push_back(g.tokens);
  }
  return tokens;
}

TEST(SpeculativeTest, UntrainedDrafterOutputEqualsGreedyDecoding) {
  auto target = Target();
  ASSERT_NE(target, nullptr);
  const auto greedy = Greedy(*target, kPrompts, 40);
  for (int64_t b : {16, 4}) {
    auto drafter = Drafter(*target, b);
    ASSERT_NE(drafter, nullptr);
    SpecDecodeOptions options;
    options.max_new_tokens = 40;
    auto out = SpeculativeGenerate(*target, *drafter, kPrompts, options);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->tokens, greedy) << "B = " << b;
    const AcceptanceStats& s = out->stats;
    EXPECT_GT(s.verifications, 0);
    EXPECT_EQ(out->target_forwards, out->drafter_forwards + 1);  // + the prefill
    EXPECT_DOUBLE_EQ(s.tau(), 1.0 + static_cast<double>(s.accepted) / s.verifications);
    ASSERT_EQ(s.accepted_at.size(), static_cast<size_t>(b));
    double sum = 0;
    for (double a : s.acceptance_by_position()) sum += a;
    EXPECT_NEAR(sum, s.tau(), 1e-12);
  }
}

// The drafter's cache of context keys and values (SpecDecodeOptions::drafter_kv_cache, on by
// default) gives the proposals of the whole context: the same output and the same acceptance, to
// the verification, with sequences that end at different times and short last blocks.
TEST(SpeculativeTest, TheDraftersCacheProposesWhatTheWholeContextDoes) {
  auto target = Target();
  ASSERT_NE(target, nullptr);
  for (int64_t b : {16, 4}) {
    auto drafter = Drafter(*target, b);
    ASSERT_NE(drafter, nullptr);
    SpecDecodeOptions options;
    options.max_new_tokens = 37;
    options.stop_token_ids = {17};
    auto cached = SpeculativeGenerate(*target, *drafter, kPrompts, options);
    options.drafter_kv_cache = false;
    auto whole = SpeculativeGenerate(*target, *drafter, kPrompts, options);
    ASSERT_TRUE(cached.ok() && whole.ok()) << cached.status() << whole.status();
    EXPECT_EQ(cached->tokens, whole->tokens) << "B = " << b;
    EXPECT_EQ(cached->stats.verifications, whole->stats.verifications) << "B = " << b;
    EXPECT_EQ(cached->stats.accepted, whole->stats.accepted) << "B = " << b;
    EXPECT_EQ(cached->stats.accepted_at, whole->stats.accepted_at) << "B = " << b;
    EXPECT_EQ(cached->stats.emitted_histogram, whole->stats.emitted_histogram) << "B = " << b;
    EXPECT_EQ(cached->drafter_forwards, whole->drafter_forwards);
    std::cerr << "[spec_test] B = " << b << ": " << cached->stats.accepted << " proposals kept in "
              << cached->stats.verifications << " verifications, both ways\n";
  }
}

// A drafter loaded for decoding keeps its weights in the target's dtype
// (SetInferenceDrafterOptions): with a bf16 target it computes what the training drafter (fp32
// masters cast to bf16 at every use) computes, bit for bit, whole-context and cached,
// single-sequence and batched.
TEST(SpeculativeTest, AnInferenceDrafterComputesWhatTheTrainingOneDoes) {
  nn::TargetModelOptions target_options;
  target_options.dtype = at::kBFloat16;
  target_options.full = true;
  auto target = nn::BuiltinTarget("tiny-qwen3", target_options);
  ASSERT_TRUE(target.ok()) << target.status();
  drafter::DrafterConfig config;
  config.target = (*target)->config();
  config.num_layers = 2;
  config.block_size = 4;
  config.mask_token_id = 1;
  config.target_layer_ids = (*target)->layer_ids();
  drafter::DrafterOptions training;
  training.seed = 5;
  training.init_std = 0.2;
  training.compute_dtype = at::kBFloat16;
  drafter::DrafterOptions inference;
  SetInferenceDrafterOptions(**target, &inference);
  ASSERT_EQ(inference.dtype, at::kBFloat16);
  auto a = drafter::DrafterModel::Create(config, training, (*target)->embed_tokens(),
                                         (*target)->lm_head());
  auto b = drafter::DrafterModel::Create(config, inference, (*target)->embed_tokens(),
                                         (*target)->lm_head());
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  {
    at::NoGradGuard no_grad;
    const std::vector<drafter::NamedParameter> from = (*a)->parameters(), to = (*b)->parameters();
    ASSERT_EQ(from.size(), to.size());
    for (size_t i = 0; i < from.size(); ++i) to[i].tensor.copy_(from[i].tensor);
  }
  const int64_t k = config.feature_dim();
  at::manual_seed(9);
  for (const int64_t n : {1, 3}) {
    SCOPED_TRACE(n);
    std::vector<at::Tensor> contexts;
    std::vector<std::vector<int64_t>> tokens;
    for (int64_t j = 0; j < n; ++j) {
      contexts.push_back(at::randn({5 + 3 * j, k}).to(at::kBFloat16));
      std::vector<int64_t> t;
      for (int64_t r = 0; r <= 5 + 3 * j; ++r) t.push_back(20 + 7 * r + j);
      tokens.push_back(t);
    }
    const drafter::DrafterBatch batch = drafter::DecodingBatch(contexts, tokens, {}, 4);
    at::NoGradGuard no_grad;
    auto whole_a = (*a)->Forward(batch);
    auto whole_b = (*b)->Forward(batch);
    ASSERT_TRUE(whole_a.ok() && whole_b.ok()) << whole_a.status() << whole_b.status();
    EXPECT_TRUE(whole_a->equal(*whole_b));
    std::vector<drafter::DrafterKvCache> caches_a(n), caches_b(n);
    std::vector<drafter::CachedBlock> blocks_a, blocks_b;
    for (int64_t j = 0; j < n; ++j) {
      drafter::CachedBlock block;
      block.new_features = contexts[j];
      block.anchor_token = tokens[j].back();
      block.cache = &caches_a[j];
      blocks_a.push_back(block);
      block.cache = &caches_b[j];
      blocks_b.push_back(block);
    }
    auto cached_a = (*a)->ForwardCached(blocks_a);
    auto cached_b = (*b)->ForwardCached(blocks_b);
    ASSERT_TRUE(cached_a.ok() && cached_b.ok()) << cached_a.status() << cached_b.status();
    EXPECT_TRUE(cached_a->equal(*cached_b));
  }
}

// A proposer that knows the greedy continuation and is right for the first `right` slots only;
// with `whole_context` it checks that it was given the features of the whole context.
Proposer KnowingProposer(const std::vector<std::vector<int64_t>>& prompts,
                         const std::vector<std::vector<int64_t>>& continuation, int64_t b,
                         int64_t right, bool whole_context = true) {
  return [=](const std::vector<const DraftContext*>& contexts) {
    std::vector<std::vector<int64_t>> out;
    for (const DraftContext* c : contexts) {
      size_t which = 0;
      while (which < prompts.size() &&
             !std::equal(prompts[which].begin(), prompts[which].end(), c->tokens.begin())) {
        ++which;
      }
      EXPECT_LT(which, prompts.size());
      const std::vector<int64_t>& cont = continuation[which];
      // tokens = prompt + emitted: the block's slot k + 1 is continuation[emitted + k].
      const size_t emitted = c->tokens.size() - prompts[which].size();
      int64_t rows = 0;
      for (const at::Tensor& f : c->features) rows += f.size(0);
      if (whole_context) {  // features of all but the last
        EXPECT_EQ(rows, static_cast<int64_t>(c->tokens.size()) - 1);
      }
      std::vector<int64_t> p;
      for (int64_t k = 0; k < b - 1; ++k) {
        const int64_t want = cont.at(emitted + k);
        p.push_back(k < right ? want : (want + 1) % 512);
      }
      out.push_back(p);
    }
    return absl::StatusOr<std::vector<std::vector<int64_t>>>(out);
  };
}

TEST(SpeculativeTest, AcceptsExactlyTheMatchingPrefixPlusTheBonus) {
  auto target = Target();
  ASSERT_NE(target, nullptr);
  const int64_t b = 8, max_new = 33;
  const auto reference = Greedy(*target, kPrompts, max_new + b);
  const auto greedy = Greedy(*target, kPrompts, max_new);
  for (int64_t right : std::vector<int64_t>{0, 3, b - 1}) {
    SpecDecodeOptions options;
    options.max_new_tokens = max_new;
    auto out = SpeculativeGenerate(*target, b, KnowingProposer(kPrompts, reference, b, right),
                                   kPrompts, options);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->tokens, greedy) << right << " right";
    const AcceptanceStats& s = out->stats;
    // Every verification accepts `right` proposals and emits right + 1 tokens: after the first
    // token (from the prefill) each sequence needs ceil((max_new - 1) / (right + 1)) of them.
    const int64_t per_seq = (max_new - 1 + right) / (right + 1);
    EXPECT_EQ(s.verifications, per_seq * static_cast<int64_t>(kPrompts.size())) << right;
    EXPECT_EQ(s.accepted, s.verifications * right);
    EXPECT_DOUBLE_EQ(s.tau(), 1.0 + right);
    const std::vector<double> by_pos = s.acceptance_by_position();
    for (int64_t k = 1; k < b; ++k) EXPECT_DOUBLE_EQ(by_pos[k], k <= right ? 1.0 : 0.0) << k;
  }
}

// Acceptance by context length: each verification counts in the bucket of the tokens before its
// block (prompt + output so far). A 5-token prompt stays under 1024; one of 1010 tokens crosses
// into [1024, 4096) at its 5th verification (1010 + 4j >= 1024 from j = 4, 4 tokens a step);
// one of 1100 starts there.
TEST(SpeculativeTest, AcceptanceByContextLength) {
  EXPECT_EQ(ContextBucket(0), 0u);
  EXPECT_EQ(ContextBucket(1023), 0u);
  EXPECT_EQ(ContextBucket(1024), 1u);
  EXPECT_EQ(ContextBucket(16383), 2u);
  EXPECT_EQ(ContextBucket(16384), 3u);
  EXPECT_EQ(ContextBucketMax(3), 0);
  auto target = Target();
  ASSERT_NE(target, nullptr);
  std::vector<std::vector<int64_t>> prompts = {{20, 31, 99, 400, 17}, {}, {}};
  for (int64_t i = 0; i < 1010; ++i) prompts[1].push_back(2 + (i * 37) % 400);
  for (int64_t i = 0; i < 1100; ++i) prompts[2].push_back(2 + (i * 53) % 400);
  const int64_t b = 8, max_new = 33, right = 3;
  const auto reference = Greedy(*target, prompts, max_new + b);
  SpecDecodeOptions options;
  options.max_new_tokens = max_new;
  auto out = SpeculativeGenerate(*target, b, KnowingProposer(prompts, reference, b, right), prompts,
                                 options);
  ASSERT_TRUE(out.ok()) << out.status();
  const AcceptanceStats& s = out->stats;
  ASSERT_EQ(s.by_context.size(), kContextBuckets);
  EXPECT_EQ(s.by_context[0].verifications, 8 + 4);
  EXPECT_EQ(s.by_context[1].verifications, 4 + 8);
  EXPECT_EQ(s.by_context[2].verifications + s.by_context[3].verifications, 0);
  int64_t verifications = 0, accepted = 0, emitted = 0;
  for (const ContextBucketStats& c : s.by_context) {
    verifications += c.verifications;
    accepted += c.accepted;
    emitted += c.emitted;
    EXPECT_EQ(c.accepted, c.verifications * right);
    ASSERT_EQ(c.accepted_at.size(), static_cast<size_t>(b));
    EXPECT_EQ(c.accepted_at[right], c.verifications);
  }
  EXPECT_EQ(verifications, s.verifications);
  EXPECT_EQ(accepted, s.accepted);
  EXPECT_EQ(emitted, s.emitted);
  AcceptanceStats twice = s;
  twice.Add(s);
  EXPECT_EQ(twice.by_context[1].verifications, 2 * s.by_context[1].verifications);
}

// Near the limit the block shrinks to 1 + the tokens left (the reference package's verify_size):
// only those proposals are verified, and each step's emitted / accepted counts are recorded.
TEST(SpeculativeTest, LastBlockShrinksToTheTokensLeft) {
  auto target = Target();
  ASSERT_NE(target, nullptr);
  const int64_t b = 8, max_new = 30;
  const auto reference = Greedy(*target, kPrompts, max_new + b);
  SpecDecodeOptions options;
  options.max_new_tokens = max_new;
  std::vector<int64_t> lengths;  // block lengths the proposer was asked for
  Proposer knowing = KnowingProposer(kPrompts, reference, b, b - 1);
  Proposer recording = [&](const std::vector<const DraftContext*>& contexts) {
    for (const DraftContext* c : contexts) lengths.push_back(c->block_length);
    return knowing(contexts);
  };
  auto out = SpeculativeGenerate(*target, b, recording, kPrompts, options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->tokens, Greedy(*target, kPrompts, max_new));
  // 1 token from the prefill, then 8 + 8 + 8, then 5 left: a block of 6 slots, 5 accepted.
  const size_t n = kPrompts.size();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out->step_emitted[i], (std::vector<int64_t>{8, 8, 8, 5})) << i;
    EXPECT_EQ(out->step_accepted[i], (std::vector<int64_t>{7, 7, 7, 5})) << i;
  }
  std::vector<int64_t> want_lengths;
  for (int64_t len : {8, 8, 8, 6}) want_lengths.insert(want_lengths.end(), n, len);
  EXPECT_EQ(lengths, want_lengths);
  const AcceptanceStats& s = out->stats;
  EXPECT_EQ(s.emitted, static_cast<int64_t>(29 * n));
  std::vector<int64_t> hist(b + 1, 0);
  hist[8] = static_cast<int64_t>(3 * n);
  hist[5] = static_cast<int64_t>(n);
  EXPECT_EQ(s.emitted_histogram, hist);
  EXPECT_DOUBLE_EQ(s.tau_pooled(), 29.0 / 4);
  EXPECT_EQ(s.prompts_verified, static_cast<int64_t>(n));
  EXPECT_DOUBLE_EQ(s.tau_prompt_mean(), 29.0 / 4);
  EXPECT_DOUBLE_EQ(s.tau(), 1.0 + 26.0 / 4);
}

// A proposer that keeps the context it was given (DraftBlocks::context_kept, as the drafter with
// its cache does) is handed at each block only the feature rows added since its last call; one
// that does not keep it, the whole context every time. The rows the first saw add up to the
// whole context, and both decode the same tokens.
TEST(SpeculativeTest, AProposerThatKeepsTheContextIsGivenOnlyTheNewRows) {
  auto target = Target();
  ASSERT_NE(target, nullptr);
  const int64_t b = 6, max_new = 20;
  const auto reference = Greedy(*target, kPrompts, max_new + b);
  SpecDecodeOptions options;
  options.max_new_tokens = max_new;
  Proposer knowing = KnowingProposer(kPrompts, reference, b, 2, /*whole_context=*/false);
  std::vector<std::vector<int64_t>> tokens[2];
  for (bool keeps : {true, false}) {
    std::map<const DraftContext*, int64_t> seen;  // rows handed to the proposer so far
    int64_t calls = 0;
    SamplingProposer proposer =
        [&](const std::vector<const DraftContext*>& contexts) -> absl::StatusOr<DraftBlocks> {
      for (const DraftContext* c : contexts) {
        int64_t rows = 0;
        for (const at::Tensor& f : c->features) rows += f.size(0);
        const int64_t context = static_cast<int64_t>(c->tokens.size()) - 1;
        if (keeps) {
          EXPECT_EQ(seen[c] + rows, context) << "call " << calls;
          if (seen[c] > 0) EXPECT_EQ(rows, 3) << "2 proposals accepted and the bonus";
          seen[c] += rows;
        } else {
          EXPECT_EQ(rows, context) << "call " << calls;
        }
      }
      ++calls;
      DraftBlocks out;
      ASSIGN_OR_RETURN(out.tokens, knowing(contexts));
      out.context_kept = keeps;
      return out;
    };
    auto out = SpeculativeGenerate(*target, b, proposer, kPrompts, options);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_GT(calls, 3);
    tokens[keeps ? 0 : 1] = out->tokens;
  }
  EXPECT_EQ(tokens[0], Greedy(*target, kPrompts, max_new));
  EXPECT_EQ(tokens[0], tokens[1]);
}

TEST(SpeculativeTest, StopTokenInsideAnAcceptedBlockEndsTheOutputThere) {
  auto target = Target();
  ASSERT_NE(target, nullptr);
  const int64_t b = 8;
  const auto reference = Greedy(*target, kPrompts, 40 + b);
  const int64_t stop = reference[0][5];  // accepted in the first block of prompt 0
  const auto greedy = Greedy(*target, kPrompts, 40, {stop});
  SpecDecodeOptions options;
  options.max_new_tokens = 40;
  options.stop_token_ids = {stop};
  auto out = SpeculativeGenerate(*target, b, KnowingProposer(kPrompts, reference, b, b - 1),
                                 kPrompts, options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->tokens, greedy);
  EXPECT_EQ(out->tokens[0].back(), stop);
  EXPECT_LE(out->tokens[0].size(), 6u);
  // The stopping step emitted up to the stop token only; every token but the prefill's is in a
  // step, and the per-prompt mean averages each prompt's own steps.
  double prompt_taus = 0;
  int64_t verified = 0;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    int64_t sum = 0;
    for (int64_t e : out->step_emitted[i]) sum += e;
    EXPECT_EQ(sum + 1, static_cast<int64_t>(out->tokens[i].size())) << i;
    if (out->step_emitted[i].empty()) continue;
    ++verified;
    prompt_taus += static_cast<double>(sum) / out->step_emitted[i].size();
  }
  ASSERT_EQ(out->step_emitted[0].size(), 1u);
  EXPECT_EQ(out->step_emitted[0].back(), static_cast<int64_t>(out->tokens[0].size()) - 1);
  EXPECT_EQ(out->step_accepted[0].back(), b - 1);  // accepted past the stop: counted
  EXPECT_EQ(out->stats.prompts_verified, verified);
  EXPECT_NEAR(out->stats.tau_prompt_mean(), prompt_taus / verified, 1e-12);
}

TEST(SpeculativeTest, RefusesADrafterOfAnotherTarget) {
  auto target = Target();
  ASSERT_NE(target, nullptr);
  auto drafter = Drafter(*target, 4, {0, 2});
  ASSERT_NE(drafter, nullptr);
  auto out = SpeculativeGenerate(*target, *drafter, kPrompts, SpecDecodeOptions());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("the drafter reads target layers [0, 2]"),
            std::string::npos)
      << out.status();

  nn::TargetModelOptions features_only;
  features_only.dtype = at::kFloat;
  auto extractor = nn::BuiltinTarget("tiny-qwen3", features_only);
  ASSERT_TRUE(extractor.ok());
  auto d = Drafter(**extractor, 4);
  auto no = SpeculativeGenerate(**extractor, *d, kPrompts, SpecDecodeOptions());
  EXPECT_EQ(no.status().code(), absl::StatusCode::kFailedPrecondition) << no.status();
}

}  // namespace
}  // namespace dflash::spec

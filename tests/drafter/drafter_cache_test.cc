// DrafterModel::ForwardCached (common/drafter/drafter_cached_forward.cc) against Forward over the
// whole context: the same hidden states for blocks after contexts of several lengths, with the
// cache extended between calls by some rows, none, or many; short blocks; a sliding layer with a
// window; and its refusals (fp32, CPU).
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/drafter/drafter_model.h"
#include "tests/drafter/test_util.h"

namespace dflash::drafter {
namespace {

using testing::MakeModel;
using testing::MaxRelError;
using testing::TinyConfig;

// A sequence: its context's features (rows 0 .. n-1), its tokens (n + 1: the anchor last).
struct Seq {
  at::Tensor features;
  std::vector<int64_t> tokens;
  int64_t block_length = 0;
};

// Forward over each sequence's whole context, packed as speculative decoding packs it.
at::Tensor WholeContext(const DrafterModel& m, const std::vector<Seq>& seqs) {
  std::vector<at::Tensor> contexts;
  std::vector<std::vector<int64_t>> tokens;
  std::vector<int64_t> lengths;
  for (const Seq& s : seqs) {
    contexts.push_back(s.features);
    tokens.push_back(s.tokens);
    lengths.push_back(s.block_length);
  }
  absl::StatusOr<at::Tensor> out =
      m.Forward(DecodingBatch(contexts, tokens, lengths, m.config().block_size));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : at::Tensor();
}

// Grows each sequence by `more[j]` context rows (random features, tokens) and checks the cached
// forward, given only those rows, against the whole context.
void GrowAndCompare(const DrafterModel& m, std::vector<Seq>* seqs,
                    std::vector<DrafterKvCache>* caches, const std::vector<int64_t>& more,
                    int round) {
  std::vector<CachedBlock> blocks;
  for (size_t j = 0; j < seqs->size(); ++j) {
    Seq& s = (*seqs)[j];
    const int64_t k = m.config().feature_dim();
    at::Tensor added = at::randn({more[j], k});
    s.features = s.features.defined() ? at::cat({s.features, added}, 0) : added;
    for (int64_t r = 0; r < more[j]; ++r)
      s.tokens.insert(s.tokens.end() - 1, (round * 37 + r) % 250);
    CachedBlock block;
    block.cache = &(*caches)[j];
    block.new_features = added;
    block.anchor_token = s.tokens.back();
    block.block_length = s.block_length;
    blocks.push_back(block);
  }
  absl::StatusOr<at::Tensor> cached = m.ForwardCached(blocks);
  ASSERT_TRUE(cached.ok()) << cached.status();
  const at::Tensor whole = WholeContext(m, *seqs);
  ASSERT_EQ(cached->sizes(), whole.sizes());
  EXPECT_LT(MaxRelError(*cached, whole), 1e-5) << "round " << round;
  for (size_t j = 0; j < seqs->size(); ++j) {
    EXPECT_EQ((*caches)[j].rows, (*seqs)[j].features.size(0)) << "sequence " << j;
  }
}

void CheckCacheAgainstWholeContext(const DrafterConfig& config) {
  at::manual_seed(3);
  std::unique_ptr<DrafterModel> m = MakeModel(config, 11);
  ASSERT_NE(m, nullptr);
  {  // DFlash2's convolutions off their identity start, so that the blocks' slots mix
    at::NoGradGuard no_grad;
    for (const NamedParameter& p : m->parameters()) {
      if (p.name.find("conv.") != std::string::npos)
        p.tensor.add_(at::randn(p.tensor.sizes()) * 0.2);
    }
  }
  std::vector<Seq> seqs(3);
  for (size_t j = 0; j < seqs.size(); ++j) seqs[j].tokens = {static_cast<int64_t>(10 + j)};
  seqs[1].block_length = 2;  // a short last block
  std::vector<DrafterKvCache> caches(seqs.size());
  // The prompt (1 row, 5 rows, 12 rows), then accepted tokens: some, none, many.
  GrowAndCompare(*m, &seqs, &caches, {1, 5, 12}, 0);
  GrowAndCompare(*m, &seqs, &caches, {3, 0, 4}, 1);
  GrowAndCompare(*m, &seqs, &caches, {1, 2, 9}, 2);
}

TEST(DrafterCache, ForwardCachedEqualsForwardOverTheWholeContext) {
  CheckCacheAgainstWholeContext(TinyConfig());
}

TEST(DrafterCache, ASlidingLayerWithAWindowToo) {
  DrafterConfig config = TinyConfig();
  SetSlidingLayers(&config, {1}, 6);
  CheckCacheAgainstWholeContext(config);
}

DrafterConfig Dflash2Config() {
  DrafterConfig config = TinyConfig();
  config.conv_kernel_size = 3;
  config.conv_group_size = 16;
  config.selector_rank = 8;
  config.selector_top_k = 5;
  return config;
}

// DFlash2 (docs/method.md §2.2): the convolutions run over the block's slots alone, so the cached
// forward gives the same rows.
TEST(DrafterCache, ADflash2DrafterToo) { CheckCacheAgainstWholeContext(Dflash2Config()); }

// One sequence's attention reads its cache buffers in place (the anchor's row and the block's own
// keys and values written into the scratch after the context): the same rows as Forward, with the
// scratch filled with NaN before every block (no stale or uninitialized row may be read: without
// the block's rows written there this fails), through the buffers' growth (no reserve: blocks
// outgrow the buffer) and with a reserve that holds the whole sequence. The anchor's row is
// zeroed for the fused GPU kernels, which multiply a masked row's zero weight by its value (NaN
// would survive that); the CPU reference here reads only visible rows, so this test cannot see
// that zeroing: draft_cache checks it on a GPU (the cached and uncached hidden states).
void CheckOneSequence(const DrafterConfig& config) {
  for (const int64_t reserve : {int64_t{0}, int64_t{64}}) {
    SCOPED_TRACE(reserve);
    at::manual_seed(5);
    std::unique_ptr<DrafterModel> m = MakeModel(config, 11);
    ASSERT_NE(m, nullptr);
    std::vector<Seq> seqs(1);
    seqs[0].tokens = {12};
    std::vector<DrafterKvCache> caches(1);
    caches[0].reserve = reserve;
    const std::vector<int64_t> more = {1, 0, 5, 2, 30};
    for (size_t round = 0; round < more.size(); ++round) {
      seqs[0].block_length = round == 3 ? 3 : 0;  // a short block once
      for (std::vector<at::Tensor>* buffers : {&caches[0].k, &caches[0].v}) {
        for (at::Tensor& b : *buffers) {
          const int64_t held = caches[0].rows;
          b.narrow(0, held, b.size(0) - held).fill_(std::numeric_limits<float>::quiet_NaN());
        }
      }
      GrowAndCompare(*m, &seqs, &caches, {more[round]}, static_cast<int>(round));
    }
    const int64_t capacity = caches[0].k.front().size(0);
    EXPECT_GE(capacity, caches[0].rows + 1 + m->config().block_size);
    if (reserve > 0) EXPECT_EQ(capacity, reserve);  // 38 rows + 1 + a block of 4 fit in 64
  }
}

// Full layers, a sliding layer (window 6) and DFlash2.
TEST(DrafterCache, OneSequenceReadsItsBuffersInPlace) {
  DrafterConfig sliding = TinyConfig();
  SetSlidingLayers(&sliding, {1}, 6);
  for (const auto& [name, config] : {std::pair<const char*, DrafterConfig>{"full", TinyConfig()},
                                     {"sliding", sliding},
                                     {"dflash2", Dflash2Config()}}) {
    SCOPED_TRACE(name);
    CheckOneSequence(config);
  }
}

TEST(DrafterCache, RefusesBlocksItCannotRun) {
  std::unique_ptr<DrafterModel> m = MakeModel(TinyConfig(), 11);
  DrafterKvCache cache;
  CachedBlock block;
  block.anchor_token = 3;
  EXPECT_EQ(m->ForwardCached({block}).status().code(), absl::StatusCode::kInvalidArgument);
  block.cache = &cache;
  block.new_features = at::randn({2, 5});  // not K*H wide
  EXPECT_EQ(m->ForwardCached({block}).status().code(), absl::StatusCode::kInvalidArgument);
  block.new_features = at::randn({2, m->config().feature_dim()});
  block.block_length = m->config().block_size + 1;
  EXPECT_EQ(m->ForwardCached({block}).status().code(), absl::StatusCode::kInvalidArgument);
  block.block_length = 0;
  block.anchor_token = 256;
  EXPECT_EQ(m->ForwardCached({block}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.rows, 0);  // nothing cached from a refused call
}

}  // namespace
}  // namespace dflash::drafter

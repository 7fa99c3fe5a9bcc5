// The DFlash drafter on the CPU in fp32: forward, loss and every gradient against the independent
// float64 reference of dflash_reference.py; the attention mask of method.md §3.3 on hand-built
// cases, at the attention level and through the whole model; the loss targets and the fused
// chunked lm_head + cross entropy.
#include "common/drafter/drafter_model.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/config/run_spec.h"
#include "common/drafter/drafter_attention.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/drafter/weighted_ce.h"
#include "tests/drafter/test_util.h"

namespace dflash::drafter {
namespace {

namespace fs = std::filesystem;
using testing::MakeModel;
using testing::MaxRelError;
using testing::TinyConfig;

constexpr double kFp32Tolerance = 1e-4;

at::Tensor Longs(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); }
at::Tensor Ints(const std::vector<int32_t>& v) { return at::tensor(v, at::kInt); }

// The reference's checkpoint loaded through ImportDrafter and run on its batch.
class ReferenceParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    dir_ = testing::ReferenceDir(&error);
    ASSERT_TRUE(error.empty()) << error;
    expected_ = testing::ReadAll(dir_ / "expected.safetensors");
  }

  // Forward, loss and backward with `options`; max relative error of the hidden states, loss
  // weights, numerator and denominator, slot counts and every gradient (parameters and features)
  // against the float64 reference, each checked against `tolerance` and printed.
  // dpace: the loss under D-PACE weighting, against the reference's "dpace." tensors; dflash2:
  // the DFlash2 drafter (drafter2/: convolutions, selector loss) against its "dflash2." tensors.
  void RunAndCompare(const DrafterOptions& options, double tolerance, const char* label,
                     bool dpace = false, bool dflash2 = false) {
    const std::string x = dpace ? "dpace." : dflash2 ? "dflash2." : "";
    const std::string h = dflash2 ? "dflash2." : "";
    auto target = model::LoadHfConfig((dir_ / "target").string());
    ASSERT_TRUE(target.ok()) << target.status();
    DrafterConfig config = TinyConfig();
    config.target = *target;
    if (dflash2) {
      config.conv_kernel_size = 2;
      config.conv_group_size = 16;
      config.selector_rank = 8;
      config.selector_top_k = 5;
    }
    auto frozen = testing::ReadAll(dir_ / "frozen.safetensors");
    auto created = DrafterModel::Create(config, options, frozen["embed_tokens"], frozen["lm_head"]);
    ASSERT_TRUE(created.ok()) << created.status();
    DrafterModel& model = **created;
    absl::Status imported =
        ImportDrafter((dir_ / (dflash2 ? "drafter2" : "drafter")).string(), &model);
    ASSERT_TRUE(imported.ok()) << imported;

    auto in = testing::ReadAll(dir_ / "batch.safetensors");
    DrafterBatch batch{in["features"].clone().requires_grad_(true),
                       in["input_ids"],
                       in["positions"],
                       in["cu_seqlens"],
                       in["anchors"],
                       in["loss_mask"]};
    LossOptions loss_options;
    loss_options.gamma = std::stod(testing::ReadMetadata(dir_ / "batch.safetensors", "gamma"));
    loss_options.logits_chunk_rows = 5;  // several chunks, the last one partial
    if (dpace) {
      loss_options.weighting = LossWeighting::kDpace;
      loss_options.dpace_alpha =
          std::stod(testing::ReadMetadata(dir_ / "batch.safetensors", "dpace_alpha"));
    }
    auto hidden = model.Forward(batch);
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    auto loss = model.Loss(batch, *hidden, loss_options);
    ASSERT_TRUE(loss.ok()) << loss.status();
    auto targets = model.Targets(batch, loss_options.gamma);
    ASSERT_TRUE(targets.ok()) << targets.status();
    loss->numerator.backward();

    std::vector<std::pair<std::string, double>> errors = {
        {h + "hidden", MaxRelError(*hidden, expected_[h + "hidden"])},
        {"weights", MaxRelError(targets->weights, expected_["weights"])},
        {x + "numerator", MaxRelError(loss->numerator, expected_[x + "numerator"])},
        {x + "denominator",
         MaxRelError(loss->denominator,
                     expected_[(dpace ? "dpace." : "") + std::string("denominator")])},
        {x + "grad.features", MaxRelError(batch.features.grad(), expected_[x + "grad.features"])},
    };
    for (const NamedParameter& p : model.parameters()) {
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      EXPECT_EQ(p.tensor.grad().scalar_type(), options.dtype) << p.name;
      errors.push_back(
          {x + "grad." + p.name, MaxRelError(p.tensor.grad(), expected_[x + "grad." + p.name])});
    }
    double worst = 0;
    for (const auto& [name, err] : errors) {
      EXPECT_LT(err, tolerance) << label << " " << name;
      worst = std::max(worst, err);
    }
    std::printf("%s drafter vs float64 reference: %zu tensors, max relative error %.3g\n", label,
                errors.size(), worst);
    for (const auto& [name, err] : errors) std::printf("  %-50s %.3g\n", name.c_str(), err);
    EXPECT_TRUE(at::equal(loss->slot_total, expected_["slot_total"]));
    // Frozen tensors never receive gradients.
    EXPECT_FALSE(frozen["embed_tokens"].grad().defined());
    EXPECT_FALSE(frozen["lm_head"].grad().defined());
    if (tolerance <= kFp32Tolerance) {
      EXPECT_TRUE(at::equal(loss->slot_correct, expected_[h + "slot_correct"]));
    }
  }

  fs::path dir_;
  std::map<std::string, at::Tensor> expected_;
};

TEST_F(ReferenceParityTest, Fp32ForwardLossAndGradientsMatch) {
  RunAndCompare(DrafterOptions{}, kFp32Tolerance, "fp32");
}

// loss.weighting: dpace against the reference's slot-by-slot D-PACE weights (docs/method.md).
TEST_F(ReferenceParityTest, Fp32DpaceLossAndGradientsMatch) {
  RunAndCompare(DrafterOptions{}, kFp32Tolerance, "fp32 dpace", /*dpace=*/true);
}

// DFlash2 (docs/method.md §2.2): the convolutions in the forward and the selector's K-way loss
// beside the unary one, forward, loss and every gradient against the float64 reference.
TEST_F(ReferenceParityTest, Fp32Dflash2ForwardSelectorLossAndGradientsMatch) {
  RunAndCompare(DrafterOptions{}, kFp32Tolerance, "fp32 dflash2", /*dpace=*/false,
                /*dflash2=*/true);
}

// The same with each layer recomputed in the backward (drafter.recompute: layers): the
// convolutions' weights reach the checkpointed layer as its inputs, so they get gradients.
TEST_F(ReferenceParityTest, Fp32Dflash2WithRecomputedLayersMatches) {
  DrafterOptions options;
  options.recompute = Recompute::kLayers;
  RunAndCompare(options, kFp32Tolerance, "fp32 dflash2 recompute layers", /*dpace=*/false,
                /*dflash2=*/true);
}

// A block by hand: supervised slots 1, 2 and 4 of 5 (slot 3 unsupervised passes its product on),
// alpha 0.5, confidences exp(-ce) = 0.8, 0.4, 0.6: s = 0.9, 0.7, 0.8; P = 1, 0.9, 0.63, 0.63,
// 0.504; weights 0, 0.9 + 0.63 + 0.504, 0.63 + 0.504, 0, 0.504.
TEST(DpaceWeightsTest, ABlockByHand) {
  const at::Tensor mask = at::tensor({0.0f, 1.0f, 1.0f, 0.0f, 1.0f}).view({1, 5});
  const at::Tensor ce =
      at::tensor({9.0, -std::log(0.8), -std::log(0.4), 9.0, -std::log(0.6)}, at::kDouble)
          .view({1, 5});
  const at::Tensor w = DpaceWeights(mask, ce, 0.5);
  const std::vector<double> expected = {0.0, 2.034, 1.134, 0.0, 0.504};
  for (int k = 0; k < 5; ++k) EXPECT_NEAR(w[0][k].item<double>(), expected[k], 1e-6) << k;
  // alpha 1: every confidence counts as 1, so a slot's weight is the supervised slots from it on.
  const at::Tensor flat = DpaceWeights(mask, ce, 1.0);
  EXPECT_NEAR(flat[0][1].item<double>(), 3.0, 1e-6);
  EXPECT_NEAR(flat[0][4].item<double>(), 1.0, 1e-6);
}

// method.md §4: bf16 compute with fp32 master weights; gradients arrive in fp32. bf16 has 8
// significant bits (relative rounding 2^-9): the bound allows the error to grow through 2 layers
// and backward.
TEST_F(ReferenceParityTest, Bf16ComputeWithFp32MasterWeights) {
  DrafterOptions options;
  options.compute_dtype = at::kBFloat16;
  RunAndCompare(options, 5e-2, "bf16-compute");  // measured 2.6e-2
}

// One-hot values read the attention weights back: with q = 0 every visible key gets the same
// weight, so output row r times the number of visible keys is the indicator of its visible keys.
TEST(DrafterAttentionTest, MaskSemanticsOnHandBuiltBlocks) {
  // Documents: rows 0-2 doc 0, rows 3-5 doc 1. Blocks of 2: anchor 2 (doc 0), anchor 3 (first row
  // of doc 1: no context at all), anchor 5 (doc 1), and one padding block.
  const int64_t t = 6, b = 2, n = 4, q_rows = n * b, keys = t + q_rows;
  at::manual_seed(5);
  at::Tensor doc_ids = Longs({0, 0, 0, 1, 1, 1});
  BlockMask mask = BuildBlockMask(Longs({2, 3, 5, -1}), doc_ids, b);
  EXPECT_TRUE(at::equal(mask.ctx_begin, Longs({0, 3, 3, 0})));
  at::Tensor q = at::zeros({q_rows, 2, keys}).requires_grad_(true);  // 2 query heads, 1 kv head
  at::Tensor k = at::randn({keys, 1, keys}).requires_grad_(true);
  at::Tensor v = at::eye(keys).unsqueeze(1).requires_grad_(true);  // [keys, 1, keys]
  // Visible keys per block: context rows strictly before the anchor in its document, then the
  // block's own rows (keys t + j*b ...).
  const std::vector<std::set<int64_t>> visible = {
      {0, 1, t + 0, t + 1}, {t + 2, t + 3}, {3, 4, t + 4, t + 5}, {}};
  for (int64_t max_elements : {int64_t{1} << 26, int64_t{1}}) {  // one chunk; one block per chunk
    ReferenceDrafterAttention attention(max_elements);
    at::Tensor out = attention.Forward(q, k, v, mask, 0.25);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{q_rows, 2, keys}));
    for (int64_t r = 0; r < q_rows; ++r) {
      const std::set<int64_t>& vis = visible[r / b];
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t key = 0; key < keys; ++key) {
          const double want = vis.count(key) ? 1.0 / static_cast<double>(vis.size()) : 0.0;
          EXPECT_NEAR(out[r][h][key].item<double>(), want, 1e-6)
              << "row " << r << " head " << h << " key " << key;
        }
      }
    }
    q.mutable_grad() = at::Tensor();
    k.mutable_grad() = at::Tensor();
    v.mutable_grad() = at::Tensor();
    (out * at::randn(out.sizes())).sum().backward();
    for (const at::Tensor* g : {&q.grad(), &k.grad(), &v.grad()}) {
      EXPECT_TRUE(at::isfinite(*g).all().item<bool>());
    }
    // The padding block's queries get no gradient.
    EXPECT_EQ(q.grad().narrow(0, 3 * b, b).abs().max().item<double>(), 0.0);
  }
}

// A sliding-attention layer's view (method.md §2.1), read back the same way: slot k sees its
// block's slots k' <= k only, and with window W only rows less than W positions before its own
// (context rows c >= a + k - W + 1, block rows k' > k - W). Window 0: causal only.
TEST(DrafterAttentionTest, SlidingLayersNarrowWhatEachSlotSees) {
  const int64_t t = 6, b = 3, n = 2, q_rows = n * b, keys = t + q_rows;
  at::manual_seed(6);
  BlockMask mask = BuildBlockMask(Longs({1, 4}), Longs({0, 0, 0, 0, 0, 0}), b);
  mask.causal = true;
  at::Tensor q = at::zeros({q_rows, 1, keys});
  at::Tensor k = at::randn({keys, 1, keys});
  at::Tensor v = at::eye(keys).unsqueeze(1);
  const int64_t own0 = t, own1 = t + b;  // the blocks' first rows among the keys
  for (int64_t window : {int64_t{3}, int64_t{0}}) {
    mask.window = window;
    // Per query row (block 0 anchored at row 1, block 1 at row 4).
    const std::vector<std::set<int64_t>> visible =
        window == 3 ? std::vector<std::set<int64_t>>{{0, own0},
                                                     {0, own0, own0 + 1},
                                                     {own0, own0 + 1, own0 + 2},
                                                     {2, 3, own1},
                                                     {3, own1, own1 + 1},
                                                     {own1, own1 + 1, own1 + 2}}
                    : std::vector<std::set<int64_t>>{{0, own0},
                                                     {0, own0, own0 + 1},
                                                     {0, own0, own0 + 1, own0 + 2},
                                                     {0, 1, 2, 3, own1},
                                                     {0, 1, 2, 3, own1, own1 + 1},
                                                     {0, 1, 2, 3, own1, own1 + 1, own1 + 2}};
    for (int64_t max_elements : {int64_t{1} << 26, int64_t{1}}) {
      const at::Tensor out = ReferenceDrafterAttention(max_elements).Forward(q, k, v, mask, 0.25);
      for (int64_t r = 0; r < q_rows; ++r) {
        for (int64_t key = 0; key < keys; ++key) {
          const double want =
              visible[r].count(key) ? 1.0 / static_cast<double>(visible[r].size()) : 0.0;
          EXPECT_NEAR(out[r][0][key].item<double>(), want, 1e-6)
              << "window " << window << " row " << r << " key " << key;
        }
      }
    }
  }
  // The fused kernel does not take a sliding layer's view: the reference runs it.
  EXPECT_FALSE(FusedDrafterAttention::Supports(q, k, mask));
}

// Each chunk of blocks scores only the context rows its blocks can see (speculative decoding
// packs one block per sequence: scoring every block against the whole batch's context made the
// reference's cost grow with the batch squared). The same outputs and gradients whatever the
// chunking, and each document's blocks the same as when its document is attended alone: eight
// documents, short blocks, a block with no context and padding. (float64 inputs; the softmax runs
// in fp32, hence 1e-6.)
TEST(DrafterAttentionTest, ChunksSeeTheSameAsTheirDocumentsAlone) {
  const std::vector<int64_t> lengths = {5, 9, 1, 7, 12, 3, 8, 6};
  const int64_t b = 4, hq = 4, hkv = 2, d = 8;
  std::vector<int64_t> doc_ids, anchors, block_lengths, starts;
  for (size_t j = 0; j < lengths.size(); ++j) {
    starts.push_back(static_cast<int64_t>(doc_ids.size()));
    doc_ids.insert(doc_ids.end(), static_cast<size_t>(lengths[j]), static_cast<int64_t>(j));
    // One block per document at its last row (the first document's row 0 for no context).
    anchors.push_back(j == 0 ? 0 : starts.back() + lengths[j] - 1);
    block_lengths.push_back(1 + static_cast<int64_t>(j) % b);
  }
  anchors.push_back(-1);  // padding
  block_lengths.push_back(b);
  const int64_t t = static_cast<int64_t>(doc_ids.size()), n = static_cast<int64_t>(anchors.size());
  at::manual_seed(8);
  const at::Tensor q0 = at::randn({n * b, hq, d}, at::kDouble);
  const at::Tensor k0 = at::randn({t + n * b, hkv, d}, at::kDouble);
  const at::Tensor v0 = at::randn({t + n * b, hkv, d}, at::kDouble);
  const at::Tensor dout = at::randn({n * b, hq, d}, at::kDouble);
  const BlockMask mask = BuildBlockMask(Longs(anchors), Longs(doc_ids), b, Longs(block_lengths));
  std::vector<at::Tensor> first;
  for (int64_t max_elements : {int64_t{1} << 26, int64_t{2000}, int64_t{1}}) {
    at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
               v = v0.clone().requires_grad_(true);
    const at::Tensor out = ReferenceDrafterAttention(max_elements).Forward(q, k, v, mask, 0.3);
    (out * dout).sum().backward();
    const std::vector<at::Tensor> got = {out.detach(), q.grad(), k.grad(), v.grad()};
    if (first.empty()) {
      first = got;
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT((got[i] - first[i]).abs().max().item<double>(), 1e-6)
          << "max_elements " << max_elements << " tensor " << i;
    }
  }
  // Document j alone: its rows, its block.
  for (size_t j = 0; j < lengths.size(); ++j) {
    const int64_t len = lengths[j], s0 = starts[j];
    const int64_t anchor = anchors[j] - s0;
    const BlockMask alone = BuildBlockMask(Longs({anchor}), Longs(std::vector<int64_t>(len, 0)), b,
                                           Longs({block_lengths[j]}));
    const at::Tensor q = q0.narrow(0, static_cast<int64_t>(j) * b, b);
    const int64_t own = t + static_cast<int64_t>(j) * b;  // the block's own rows among the keys
    const at::Tensor k = at::cat({k0.narrow(0, s0, len), k0.narrow(0, own, b)}, 0);
    const at::Tensor v = at::cat({v0.narrow(0, s0, len), v0.narrow(0, own, b)}, 0);
    const at::Tensor out = ReferenceDrafterAttention().Forward(q, k, v, alone, 0.3);
    EXPECT_LT((out - first[0].narrow(0, static_cast<int64_t>(j) * b, b)).abs().max().item<double>(),
              1e-6)
        << "document " << j;
  }
}

// A small packed batch for the model-level tests: documents of 6, 5 and 7 rows.
DrafterBatch SmallBatch(const DrafterConfig& c, const std::vector<int64_t>& anchors) {
  const int64_t t = 18;
  at::manual_seed(17);
  std::vector<int64_t> positions;
  for (int64_t len : {6, 5, 7}) {
    for (int64_t p = 0; p < len; ++p) positions.push_back(p);
  }
  std::vector<int64_t> loss_mask(t, 1);
  loss_mask[8] = 0;
  return DrafterBatch{at::randn({t, c.feature_dim()}),
                      at::randint(0, c.target.vocab_size - 1, {t}, at::kLong),
                      Longs(positions),
                      Ints({0, 6, 11, 18}),
                      Longs(anchors),
                      Longs(loss_mask)};
}

// Through the whole model: a block's output depends on the features of its document's rows
// strictly before the anchor and on nothing else (not the anchor's own row, later rows, or other
// documents); a block at a document start has no context and still runs; a padding block is
// finite.
TEST(DrafterModelTest, ContextVisibilityThroughTheModel) {
  const DrafterConfig c = TinyConfig();
  auto model = MakeModel(c, 7);
  ASSERT_NE(model, nullptr);
  DrafterBatch batch = SmallBatch(c, {3, 6, 8, -1});  // doc 0 row 3; doc 1 start; doc 1 row 8
  auto base = model->Forward(batch);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(at::isfinite(*base).all().item<bool>());
  const int64_t b = c.block_size;
  auto changed_blocks = [&](int64_t row) {
    DrafterBatch perturbed = batch;
    perturbed.features = batch.features.clone();
    perturbed.features[row] += 1.0;
    auto out = model->Forward(perturbed);
    EXPECT_TRUE(out.ok()) << out.status();
    std::set<int64_t> changed;
    for (int64_t j = 0; j < 4; ++j) {
      at::Tensor diff = (out->narrow(0, j * b, b) - base->narrow(0, j * b, b)).abs().max();
      if (diff.item<double>() > 1e-5) changed.insert(j);
    }
    return changed;
  };
  EXPECT_EQ(changed_blocks(2), (std::set<int64_t>{0}));  // before anchor 3, same document
  EXPECT_EQ(changed_blocks(3), (std::set<int64_t>{}));   // the anchor's own row
  EXPECT_EQ(changed_blocks(5), (std::set<int64_t>{}));   // later rows of the document
  EXPECT_EQ(changed_blocks(6), (std::set<int64_t>{2}));  // not anchor 6's (no context), 8's
  EXPECT_EQ(changed_blocks(7), (std::set<int64_t>{2}));  // before anchor 8 only
  EXPECT_EQ(changed_blocks(12), (std::set<int64_t>{}));  // another document
}

// block_lengths (the shorter last block of speculative decoding): the first block_lengths[j] slots
// of block j compute what a model of that block size computes; lengths outside [1, B] are refused.
TEST(DrafterModelTest, BlockLengthsEqualAShorterBlock) {
  DrafterConfig c = TinyConfig();  // B = 4
  auto model = MakeModel(c, 5);
  ASSERT_NE(model, nullptr);
  const std::vector<int64_t> anchors = {3, 6, 8, -1};
  DrafterBatch batch = SmallBatch(c, anchors);
  auto full = model->Forward(batch);
  ASSERT_TRUE(full.ok()) << full.status();
  batch.block_lengths = Longs({2, 4, 3, 1});
  auto cut = model->Forward(batch);
  ASSERT_TRUE(cut.ok()) << cut.status();
  // The same weights (the seed; no parameter depends on B) with blocks of 2 and 3 slots.
  std::map<int64_t, at::Tensor> shorter;
  for (int64_t b : {2, 3}) {
    DrafterConfig cb = c;
    cb.block_size = b;
    auto m = MakeModel(cb, 5);
    ASSERT_NE(m, nullptr);
    auto out = m->Forward(SmallBatch(cb, anchors));
    ASSERT_TRUE(out.ok()) << out.status();
    shorter[b] = *out;
  }
  EXPECT_LT(MaxRelError(cut->narrow(0, 0, 2), shorter[2].narrow(0, 0, 2)), 1e-5);
  EXPECT_LT(MaxRelError(cut->narrow(0, 4, 4), full->narrow(0, 4, 4)), 1e-6);
  EXPECT_LT(MaxRelError(cut->narrow(0, 8, 3), shorter[3].narrow(0, 6, 3)), 1e-5);
  // Not a no-op: the full block's first slots differ from the cut ones.
  EXPECT_GT(MaxRelError(full->narrow(0, 0, 2), shorter[2].narrow(0, 0, 2)), 1e-3);
  for (const std::vector<int64_t>& bad :
       std::vector<std::vector<int64_t>>{{0, 4, 4, 4}, {4, 4, 5, 4}, {4, 4}}) {
    batch.block_lengths = Longs(bad);
    auto refused = model->Forward(batch);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("block_lengths"), std::string::npos)
        << refused.status();
  }
}

TEST(DrafterModelTest, BlockInputsAndLossTargets) {
  const DrafterConfig c = TinyConfig();  // B = 4
  auto model = MakeModel(c, 3);
  ASSERT_NE(model, nullptr);
  DrafterBatch batch = SmallBatch(c, {3, 7, 9, -1});
  auto targets = model->Targets(batch, 2.0);
  ASSERT_TRUE(targets.ok()) << targets.status();
  const double w1 = 1.0, w2 = std::exp(-0.5), w3 = std::exp(-1.0);
  // Anchor 3 (doc 0 = rows 0-5): rows 4, 5 then the next document. Anchor 7: row 8 unsupervised.
  // Anchor 9: row 10 ends doc 1. Padding: nothing.
  const std::vector<double> want = {0, w1, w2, 0, 0, 0, w2, w3, 0, w1, 0, 0, 0, 0, 0, 0};
  at::Tensor got = targets->weights.to(at::kDouble);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].item<double>(), want[i], 1e-6) << "query row " << i;
  }
  for (int64_t k = 1; k < 3; ++k) {
    EXPECT_EQ(targets->labels[k].item<int64_t>(), batch.input_ids[3 + k].item<int64_t>());
  }
  // Denominator and slot counts of Loss agree with the targets.
  auto hidden = model->Forward(batch);
  ASSERT_TRUE(hidden.ok());
  LossOptions options;
  options.gamma = 2.0;
  auto loss = model->Loss(batch, *hidden, options);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(loss->denominator.item<double>(), 2 * w1 + 2 * w2 + w3, 1e-6);
  EXPECT_TRUE(at::equal(loss->slot_total, Longs({0, 2, 2, 1})));
}

// The fused, chunked lm_head + CE equals log_softmax over full logits, in value and gradient, for
// every chunk size; `correct` is argmax == label.
TEST(WeightedCrossEntropyTest, MatchesUnfusedForEveryChunkSize) {
  const int64_t rows = 9, h = 8, vocab = 11;
  at::manual_seed(3);
  // Tokens 0..7 have orthogonal head rows: a hidden row along one of them predicts that token.
  at::Tensor lm_head = at::cat({at::eye(h) * 2.0, at::randn({vocab - h, h}) * 0.1}, 0);
  at::Tensor base = at::randn({rows, h});
  at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong);
  at::Tensor weights = at::rand({rows});
  weights[4] = 0.0;
  for (int64_t i = 0; i < 3; ++i) {  // rows 0-2 predict their label
    labels[i] = i + 2;
    base[i] = lm_head[i + 2] * 5.0;
  }
  at::Tensor ref_h = base.clone().requires_grad_(true);
  at::Tensor logp = at::log_softmax(at::matmul(ref_h, lm_head.t()), 1);
  at::Tensor ref = -(logp.gather(1, labels.unsqueeze(1)).squeeze(1) * weights).sum();
  ref.backward();
  at::Tensor ref_correct = logp.argmax(1).eq(labels);
  for (int64_t chunk : {1, 2, 4, 9, 100}) {
    at::Tensor hh = base.clone().requires_grad_(true);
    WeightedCeResult got = WeightedCrossEntropy(hh, lm_head, labels, weights, chunk);
    got.numerator.backward();
    EXPECT_LT(MaxRelError(got.numerator, ref), 1e-6) << "chunk " << chunk;
    EXPECT_LT(MaxRelError(hh.grad(), ref_h.grad()), 1e-6) << "chunk " << chunk;
    EXPECT_TRUE(at::equal(got.correct, ref_correct)) << "chunk " << chunk;
    EXPECT_TRUE(got.correct.narrow(0, 0, 3).all().item<bool>());
    EXPECT_EQ(hh.grad()[4].abs().max().item<double>(), 0.0);  // weight 0: no gradient
  }
}

// The top-k that DFlash2's selector takes from the loss's pass (WeightedCeResult::top_k): each
// row's k largest logits, largest first, as at::topk of the full logits, for every chunk size;
// none unless asked; more than the vocabulary refused.
TEST(WeightedCrossEntropyTest, TheTopKIsThatOfTheFullLogits) {
  const int64_t rows = 9, h = 8, vocab = 40, k = 5;
  at::manual_seed(4);
  const at::Tensor lm_head = at::randn({vocab, h});
  const at::Tensor hidden = at::randn({rows, h});
  const at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong);
  const at::Tensor weights = at::rand({rows});
  const at::Tensor want = std::get<1>(at::topk(at::matmul(hidden, lm_head.t()), k, 1));
  for (int64_t chunk : {1, 2, 4, 9, 100}) {
    WeightedCeResult got = WeightedCrossEntropy(hidden, lm_head, labels, weights, chunk, k);
    ASSERT_TRUE(got.top_k.defined()) << "chunk " << chunk;
    EXPECT_TRUE(at::equal(got.top_k, want)) << "chunk " << chunk;
  }
  EXPECT_FALSE(WeightedCrossEntropy(hidden, lm_head, labels, weights, 4).top_k.defined());
  EXPECT_THROW(WeightedCrossEntropy(hidden, lm_head, labels, weights, 4, vocab + 1), c10::Error);
}

// D-PACE's one pass (CrossEntropyRowsWithGrad, then WeightedRowsNumerator): the same numerator,
// gradient, `correct` and top-k as the weighted loss given the same weights, and each row's CE.
TEST(WeightedCrossEntropyTest, TheRowsPassGivesTheWeightedLossOfAnyWeights) {
  const int64_t rows = 11, h = 8, vocab = 40, k = 4;
  at::manual_seed(5);
  const at::Tensor lm_head = at::randn({vocab, h});
  const at::Tensor base = at::randn({rows, h});
  const at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong);
  const at::Tensor weights = at::rand({rows});
  for (int64_t chunk : {1, 3, 11, 64}) {
    at::Tensor ref_h = base.clone().requires_grad_(true);
    WeightedCeResult ref = WeightedCrossEntropy(ref_h, lm_head, labels, weights, chunk, k);
    ref.numerator.backward();
    at::Tensor hh = base.clone().requires_grad_(true);
    CrossEntropyRows r = CrossEntropyRowsWithGrad(hh, lm_head, labels, chunk, k);
    at::Tensor num = WeightedRowsNumerator(hh, r, weights);
    num.backward();
    EXPECT_LT(MaxRelError(num, ref.numerator), 1e-6) << "chunk " << chunk;
    EXPECT_LT(MaxRelError(hh.grad(), ref_h.grad()), 1e-6) << "chunk " << chunk;
    EXPECT_TRUE(at::equal(r.correct, ref.correct)) << "chunk " << chunk;
    EXPECT_TRUE(at::equal(r.top_k, ref.top_k)) << "chunk " << chunk;
    const at::Tensor logp = at::log_softmax(at::matmul(base, lm_head.t()), 1);
    EXPECT_LT(MaxRelError(r.ce, -logp.gather(1, labels.unsqueeze(1)).squeeze(1)), 1e-6);
  }
}

// The kernel report names every choice: on the CPU the reference attention, ATen's SwiGLU and,
// for DFlash2, the convolutions' composition.
TEST(DrafterModelTest, TheKernelReportNamesEveryChoice) {
  auto dflash = MakeModel(TinyConfig(), 1);
  ASSERT_NE(dflash, nullptr);
  EXPECT_EQ(dflash->Kernels(),
            dflash->AttentionKernels() + "; mlp activation: silu and mul (ATen)");
  DrafterConfig two = TinyConfig();
  two.conv_kernel_size = 2;
  two.conv_group_size = 16;
  two.selector_rank = 8;
  two.selector_top_k = 5;
  auto dflash2 = MakeModel(two, 1);
  ASSERT_NE(dflash2, nullptr);
  EXPECT_EQ(dflash2->Kernels(), dflash2->AttentionKernels() +
                                    "; mlp activation: silu and mul (ATen); block convolution: "
                                    "composition (ATen)");
}

TEST(DrafterModelTest, GammaAndAcceptanceLength) {
  EXPECT_EQ(config::DefaultGamma(16), 7.0);
  EXPECT_EQ(config::DefaultGamma(10), 5.0);
  EXPECT_EQ(config::DefaultGamma(8), 4.0);
  EXPECT_EQ(config::DefaultGamma(4), std::nullopt);
  // acc = [-, 1/2, 1/2, 0]: 1 + 1/2 + 1/4 + 0.
  EXPECT_DOUBLE_EQ(ExpectedAcceptanceLength({0, 5, 4, 0}, {0, 10, 8, 3}), 1.75);
  EXPECT_DOUBLE_EQ(ExpectedAcceptanceLength({0, 0}, {0, 0}), 1.0);

  auto model = MakeModel(TinyConfig(), 1);  // B = 4 has no default gamma
  ASSERT_NE(model, nullptr);
  DrafterBatch batch = SmallBatch(TinyConfig(), {3});
  auto hidden = model->Forward(batch);
  ASSERT_TRUE(hidden.ok());
  auto loss = model->Loss(batch, *hidden, {});
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loss.status().message().find("gamma"), absl::string_view::npos) << loss.status();
}

TEST(DrafterModelTest, RejectsMalformedBatches) {
  const DrafterConfig c = TinyConfig();
  auto model = MakeModel(c, 1);
  ASSERT_NE(model, nullptr);
  auto with = [&](auto edit) {
    DrafterBatch b = SmallBatch(c, {3, 7});
    edit(b);
    return model->Forward(b).status();
  };
  const std::vector<std::pair<std::string, absl::Status>> cases = {
      {"anchors descending", with([](DrafterBatch& b) {
         b.anchors = Longs({7, 3});
       })},
      {"anchor past T", with([](DrafterBatch& b) {
         b.anchors = Longs({3, 18});
       })},
      {"anchor -2", with([](DrafterBatch& b) { b.anchors = Longs({-2}); })},
      {"features width", with([](DrafterBatch& b) {
         b.features = at::randn({18, 64});
       })},
      {"cu_seqlens short", with([](DrafterBatch& b) {
         b.cu_seqlens = Ints({0, 6, 11});
       })},
      {"token outside vocabulary", with([](DrafterBatch& b) { b.input_ids = b.input_ids + 256; })},
      {"positions length",
       with([](DrafterBatch& b) { b.positions = b.positions.narrow(0, 0, 3); })},
  };
  for (const auto& [what, status] : cases) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
  }
}

TEST(DrafterModelTest, RejectsBadConfigNamingTheField) {
  DrafterConfig c = TinyConfig();
  c.target_layer_ids = {1, 8};
  EXPECT_NE(ValidateDrafterConfig(c).message().find("target_layer_ids"), absl::string_view::npos);
  c = TinyConfig();
  c.mask_token_id = 256;
  EXPECT_NE(ValidateDrafterConfig(c).message().find("mask_token_id"), absl::string_view::npos);
  c = TinyConfig();
  c.block_size = 1;
  EXPECT_NE(ValidateDrafterConfig(c).message().find("block_size"), absl::string_view::npos);
}

}  // namespace
}  // namespace dflash::drafter

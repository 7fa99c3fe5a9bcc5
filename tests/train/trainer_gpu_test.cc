// The optimizer step overlapped with the next forward (common/train/optimizer_overlap.h) on a
// CUDA device: on by default there, and a run with it trains exactly the run without it (the
// same kernels on the same tensors; fp32 compute, whose reference attention and GEMMs repeat
// bit for bit): every step's loss and gradient norm, a checkpoint written mid-run, and the final
// parameters. A read that did not wait for the side stream's update would see a half-updated
// layer and differ. Labelled gpu; skipped without a CUDA device.
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/device/device_probe.h"
#include "common/train/trainer.h"
#include "tests/drafter/test_util.h"

namespace dflash::train {
namespace {

using drafter::DrafterBatch;
using drafter::DrafterConfig;

// Wider than the CPU tests' tiny drafter, so that the update of a layer takes long enough to
// still be running when the next forward is queued.
DrafterConfig MidConfig() {
  DrafterConfig c = drafter::testing::TinyConfig();
  model::TransformerConfig& t = c.target;
  t.vocab_size = 1024;
  t.hidden_size = 512;
  t.intermediate_size = 2048;
  t.num_attention_heads = 8;
  t.num_key_value_heads = 4;
  t.head_dim = 64;
  c.num_layers = 4;
  c.mask_token_id = 1023;
  return c;
}

// Four documents of 96 rows, 8 anchors each; `seed` draws features and ids.
DrafterBatch Batch(const DrafterConfig& c, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t docs = 4, len = 96, t = docs * len;
  std::vector<int64_t> positions, anchors;
  std::vector<int32_t> cu = {0};
  for (int64_t d = 0; d < docs; ++d) {
    for (int64_t p = 0; p < len; ++p) positions.push_back(p);
    for (int64_t a = 0; a < 8; ++a) anchors.push_back(d * len + 1 + a * 11);
    cu.push_back(static_cast<int32_t>((d + 1) * len));
  }
  auto longs = [](const std::vector<int64_t>& v) {
    return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong));
  };
  return DrafterBatch{at::randn({t, c.feature_dim()}, gen),
                      at::randint(0, c.target.vocab_size - 1, {t}, gen, at::kLong),
                      longs(positions),
                      at::tensor(at::ArrayRef<int32_t>(cu), at::TensorOptions().dtype(at::kInt)),
                      longs(anchors),
                      longs(std::vector<int64_t>(static_cast<size_t>(t), 1))};
}

OptimConfig Config() {
  OptimConfig o;
  o.lr = 1e-3;
  o.warmup_ratio = 0.0;
  o.total_steps = 8;
  return o;
}

drafter::LossOptions Loss() {
  drafter::LossOptions l;
  l.gamma = 4;
  return l;
}

class TrainerGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(TrainerGpu, OverlappedOptimizerStepsTrainTheSameRunBitForBit) {
  const DrafterConfig c = MidConfig();
  drafter::DrafterOptions options;
  options.device = c10::Device(c10::kCUDA, 0);
  const drafter::testing::ScopedDir dir("trainer_overlap");
  struct Run {
    std::vector<double> losses, norms;
    std::unique_ptr<drafter::DrafterModel> model;
  };
  auto train = [&](bool overlap) {
    Run r;
    r.model = drafter::testing::MakeModel(c, 7, options);
    auto trainer = DrafterTrainer::Create(r.model.get(), Config(), Loss());
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return r;
    EXPECT_TRUE((*trainer)->optimizer_overlapped()) << "on by default on CUDA";
    (*trainer)->SetOptimizerOverlap(overlap);
    EXPECT_EQ((*trainer)->optimizer_overlapped(), overlap);
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE((*trainer)->AddMicroBatch(Batch(c, 100 + i)).ok());
      EXPECT_TRUE((*trainer)->AddMicroBatch(Batch(c, 200 + i)).ok());
      auto s = (*trainer)->Step();
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) return r;
      r.losses.push_back(s->loss);
      r.norms.push_back(s->grad_norm);
      if (i == 3) {  // written while the update of step 3 may still run on the side stream
        EXPECT_TRUE(
            (*trainer)->SaveState((dir.path() / (overlap ? "on" : "off")).string(), {}).ok());
      }
    }
    return r;
  };
  const Run on = train(true), off = train(false);
  ASSERT_EQ(on.losses.size(), 8u);
  ASSERT_EQ(off.losses.size(), 8u);
  for (size_t i = 0; i < on.losses.size(); ++i) {
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i;
    EXPECT_EQ(on.norms[i], off.norms[i]) << "step " << i;
  }
  EXPECT_LT(on.losses.back(), on.losses.front()) << "the run trains";
  const auto a = drafter::testing::ReadAll(dir.path() / "on");
  const auto b = drafter::testing::ReadAll(dir.path() / "off");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(at::equal(t, b.at(name))) << "checkpoint after step 3: " << name;
  }
  for (size_t i = 0; i < on.model->parameters().size(); ++i) {
    EXPECT_TRUE(
        at::equal(on.model->parameters()[i].tensor.cpu(), off.model->parameters()[i].tensor.cpu()))
        << on.model->parameters()[i].name;
  }
}

}  // namespace
}  // namespace dflash::train

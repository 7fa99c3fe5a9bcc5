// The whole step in one process (common/train/local_run.h) on the CPU: a tiny random-weight Qwen3
// target produces the features of packed micro-batches, the tiny drafter trains on them; the loss
// falls on learnable data, and a run resumed from a checkpoint continues the uninterrupted run's
// loss curve bitwise (same batches, anchors, optimizer state).
#include "common/train/local_run.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/batching/memory_source.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/nn/builtin_target.h"
#include "common/train/checkpoints.h"
#include "tests/drafter/test_util.h"

namespace dflash::train {
namespace {

using drafter::DrafterConfig;
using drafter::testing::ScopedDir;
using drafter::testing::TinyConfig;

std::unique_ptr<nn::TargetModel> TinyTarget(const DrafterConfig& c, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const model::TransformerConfig& t = c.target;
  const std::map<std::string, at::Tensor> w = nn::RandomQwen3Weights(
      t, t.num_hidden_layers,
      [&](at::IntArrayRef shape) { return at::randn(shape, gen, at::kFloat); },
      at::TensorOptions().dtype(at::kFloat), std::sqrt(static_cast<double>(t.hidden_size)));
  nn::TargetModelOptions options;
  options.layer_ids = c.target_layer_ids;
  options.dtype = at::kFloat;
  auto model = nn::TargetModel::FromTensors(t, w, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

std::unique_ptr<drafter::DrafterModel> TinyDrafter(const DrafterConfig& c,
                                                   const nn::TargetModel& target) {
  drafter::DrafterOptions options;
  options.seed = 5;
  auto model = drafter::DrafterModel::Create(c, options, target.embed_tokens(), target.lm_head());
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// Learnable documents: a prompt of unsupervised random tokens, then a supervised run counting up
// from a random start (each next token is the previous + 1), so the block's later slots are
// predictable from the anchor's context.
batching::InMemorySource CountingData(int64_t docs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  batching::InMemorySource source;
  for (int64_t i = 0; i < docs; ++i) {
    const int prompt = std::uniform_int_distribution<int>(3, 10)(rng);
    const int answer = std::uniform_int_distribution<int>(20, 50)(rng);
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    for (int j = 0; j < prompt; ++j) {
      tokens.push_back(std::uniform_int_distribution<int32_t>(0, 199)(rng));
      mask.push_back(0);
    }
    const int32_t start = std::uniform_int_distribution<int32_t>(0, 199)(rng);
    for (int j = 0; j < answer; ++j) {
      tokens.push_back((start + j) % 200);
      mask.push_back(1);
    }
    source.Add(std::move(tokens), std::move(mask));
  }
  return source;
}

LocalRunOptions Options(int64_t total_steps) {
  LocalRunOptions o;
  o.batching.token_budget = 128;
  o.batching.max_length = 64;
  o.batching.grad_accum = 2;
  o.batching.seed = 7;
  o.max_anchors = 12;
  o.loss.gamma = 4;  // B = 4 has no default
  o.optim.lr = 3e-3;
  o.optim.warmup_ratio = 0.05;
  o.optim.total_steps = total_steps;
  return o;
}

TEST(LocalRunTest, LossFallsOnLearnableData) {
  const DrafterConfig c = TinyConfig();
  auto target = TinyTarget(c, 1);
  ASSERT_NE(target, nullptr);
  auto drafter = TinyDrafter(c, *target);
  ASSERT_NE(drafter, nullptr);
  const batching::InMemorySource data = CountingData(60, 2);
  LocalRunOptions options = Options(200);
  options.optim.lr = 1e-2;
  auto run = LocalRun::Create(&data, target.get(), drafter.get(), options);
  ASSERT_TRUE(run.ok()) << run.status();
  std::vector<double> losses;
  double last_tau = 0;
  for (int i = 0; i < 200; ++i) {
    auto s = (*run)->Step();
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_FALSE(s->skipped) << "step " << i;
    losses.push_back(s->loss);
    last_tau = s->acceptance_length;
  }
  double head = 0, tail = 0;
  for (int i = 0; i < 5; ++i) head += losses[i] / 5, tail += losses[195 + i] / 5;
  EXPECT_LT(tail, 0.7 * head) << head << " -> " << tail;  // 5.94 -> 3.41 when written
  EXPECT_GT(last_tau, 1.0);

  // The trained drafter exported in the serving format loads back into a fresh model and
  // computes the same hidden states.
  const ScopedDir dir("local_run_export");
  const std::string out = (dir.path() / "drafter").string();
  drafter::ExportOptions fp32;
  fp32.dtype = model::DType::kF32;
  ASSERT_TRUE(drafter::ExportDrafter(*drafter, out, fp32).ok());
  auto loaded = TinyDrafter(c, *target);
  ASSERT_NE(loaded, nullptr);
  ASSERT_TRUE(drafter::ImportDrafter(out, loaded.get()).ok());
  batching::PackedBatch packed;
  const int32_t len0 = static_cast<int32_t>(data.length(0));
  const int32_t len1 = static_cast<int32_t>(data.length(1));
  ASSERT_TRUE(batching::MaterializeBatch(data, {{0, 0, len0}, {1, 0, len1}}, 128, &packed).ok());
  const drafter::DrafterBatch shell = MakeDrafterBatch(packed, {}, at::Tensor());
  auto features = target->Forward(shell.input_ids, shell.positions, shell.cu_seqlens);
  ASSERT_TRUE(features.ok()) << features.status();
  const drafter::DrafterBatch probe = MakeDrafterBatch(packed, {5, 10, len0 + 5}, *features);
  auto a = drafter->Forward(probe);
  auto b = loaded->Forward(probe);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(*a, *b));

  // drafter.init_from: a new run starts from the exported weights (same hidden states before any
  // step); an export of another shape is refused naming the field.
  auto started = TinyDrafter(c, *target);
  LocalRunOptions from = Options(10);
  from.init_from = out;
  auto run2 = LocalRun::Create(&data, target.get(), started.get(), from);
  ASSERT_TRUE(run2.ok()) << run2.status();
  auto c2 = started->Forward(probe);
  ASSERT_TRUE(c2.ok());
  EXPECT_TRUE(at::equal(*a, *c2));
  DrafterConfig wider = c;
  wider.num_layers += 1;
  auto other = TinyDrafter(wider, *target);
  auto refused = LocalRun::Create(&data, target.get(), other.get(), from);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("drafter.init_from"), std::string::npos)
      << refused.status();
}

TEST(LocalRunTest, ResumedRunContinuesTheLossCurveExactly) {
  const DrafterConfig c = TinyConfig();
  const ScopedDir dir("local_run_resume");
  const std::string ckpt = (dir.path() / "step3.safetensors").string();
  const batching::InMemorySource data = CountingData(30, 4);
  std::vector<double> straight, resumed;
  {
    auto target = TinyTarget(c, 1);
    auto drafter = TinyDrafter(c, *target);
    auto run = LocalRun::Create(&data, target.get(), drafter.get(), Options(8));
    ASSERT_TRUE(run.ok()) << run.status();
    for (int i = 0; i < 8; ++i) {
      if (i == 3) ASSERT_TRUE((*run)->SaveCheckpoint(ckpt).ok());
      auto s = (*run)->Step();
      ASSERT_TRUE(s.ok()) << s.status();
      straight.push_back(s->loss);
    }
  }
  auto target = TinyTarget(c, 1);
  auto drafter = TinyDrafter(c, *target);
  auto run = LocalRun::Create(&data, target.get(), drafter.get(), Options(8), ckpt);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->step(), 3);
  for (int i = 3; i < 8; ++i) {
    auto s = (*run)->Step();
    ASSERT_TRUE(s.ok()) << s.status();
    resumed.push_back(s->loss);
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(resumed[i], straight[3 + i]) << "step " << 3 + i;

  // Not a run checkpoint (no data cursor): refused by name.
  const std::string bare = (dir.path() / "bare.safetensors").string();
  auto trainer = DrafterTrainer::Create(drafter.get(), Options(8).optim, Options(8).loss);
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->SaveState(bare, {}).ok());
  auto refused = LocalRun::Create(&data, target.get(), drafter.get(), Options(8), bare);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("data.cursor"), std::string::npos) << refused.status();
}

// checkpoint.every_steps 3, keep 2, 8 steps: step-3 and step-6 are written, then step-8 (the last
// step); the newest two stay. The latest resumes at step 8. Foreign and temporary files are
// ignored.
TEST(LocalRunTest, CheckpointsEveryNStepsAndAtTheEndKeepingTheNewest) {
  const DrafterConfig c = TinyConfig();
  const ScopedDir dir("local_run_rotation");
  const std::string ckpts = (dir.path() / "checkpoints").string();
  const batching::InMemorySource data = CountingData(20, 6);
  auto target = TinyTarget(c, 1);
  auto drafter = TinyDrafter(c, *target);
  LocalRunOptions options = Options(8);
  options.checkpoint_dir = ckpts;
  options.checkpoint_every = 3;
  options.checkpoint_keep = 2;
  auto run = LocalRun::Create(&data, target.get(), drafter.get(), options);
  ASSERT_TRUE(run.ok()) << run.status();
  for (int i = 0; i < 8; ++i) {
    auto s = (*run)->Step();
    ASSERT_TRUE(s.ok()) << s.status();
    if (i == 3) {  // after step 4 (one checkpoint, step 3)
      auto latest = LatestCheckpoint(ckpts);
      ASSERT_TRUE(latest.ok() && latest->has_value());
      EXPECT_EQ(**latest, CheckpointPath(ckpts, 3));
    }
  }
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(ckpts)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-000000000006.safetensors",
                                             "step-000000000008.safetensors"}));
  std::ofstream(std::filesystem::path(ckpts) / "step-000000000099.safetensors.tmp") << "x";
  std::ofstream(std::filesystem::path(ckpts) / "notes.txt") << "x";
  auto latest = LatestCheckpoint(ckpts);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, CheckpointPath(ckpts, 8));
  auto resumed = LocalRun::Create(&data, target.get(), drafter.get(), options, **latest);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->step(), 8);
  // A resume never jumps past the steps the run store committed.
  auto capped = LatestCheckpoint(ckpts, /*max_step=*/7);
  ASSERT_TRUE(capped.ok() && capped->has_value());
  EXPECT_EQ(**capped, CheckpointPath(ckpts, 6));
  auto below_all = LatestCheckpoint(ckpts, /*max_step=*/5);
  ASSERT_TRUE(below_all.ok());
  EXPECT_FALSE(below_all->has_value());
  auto none = LatestCheckpoint((dir.path() / "absent").string());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_FALSE(PruneCheckpoints(ckpts, 0).ok());
}

}  // namespace
}  // namespace dflash::train

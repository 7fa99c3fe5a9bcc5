// run.yaml -> LocalRunOptions (common/train/run_options.h): every field lands where it should, and
// what cannot be honoured is refused naming the run.yaml field.
#include "common/train/run_options.h"

#include <gtest/gtest.h>

#include <string>

namespace dflash::train {
namespace {

config::RunSpec Parse(const std::string& extra) {
  const std::string yaml =
      "name: t\nseed: 9\ntarget: {path: \"builtin:tiny-qwen3\"}\n"
      "data: {train: \"builtin:tiny-chat\", max_length: 300, long_documents: split}\n" +
      extra;
  auto spec = config::ParseRunSpec(yaml, "run.yaml", {"", /*check_paths=*/false});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : config::RunSpec{};
}

TEST(RunOptionsTest, MapsEveryField) {
  const config::RunSpec spec = Parse(
      "drafter: {block_size: 16, init_from: /some/exported/drafter}\n"
      "batching: {token_budget: 2048, max_anchors: 64, grad_accum: 3}\n"
      "optim: {lr: 2.0e-4, warmup_ratio: 0.1, schedule: linear, clip: 0.5, weight_decay: 0.01, "
      "betas: [0.8, 0.95], eps: 1.0e-6}\n"
      "checkpoint: {every_steps: 50, keep: 4}\n");
  auto o = LocalRunOptionsFor(spec, 500, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->batching.token_budget, 2048);
  EXPECT_EQ(o->batching.max_length, 300);
  EXPECT_EQ(o->batching.long_documents, batching::LongDocuments::kSplit);
  EXPECT_EQ(o->batching.grad_accum, 3);
  EXPECT_EQ(o->batching.num_pairs, 2);
  EXPECT_EQ(o->batching.seed, 9u);
  EXPECT_EQ(o->max_anchors, 64);
  EXPECT_EQ(o->init_from, "/some/exported/drafter");
  EXPECT_DOUBLE_EQ(o->loss.gamma, 7.0);  // method.md §3.5 for B = 16
  EXPECT_DOUBLE_EQ(o->optim.lr, 2e-4);
  EXPECT_DOUBLE_EQ(o->optim.warmup_ratio, 0.1);
  EXPECT_EQ(o->optim.schedule, LrSchedule::kLinear);
  EXPECT_DOUBLE_EQ(o->optim.clip_norm, 0.5);
  EXPECT_DOUBLE_EQ(o->optim.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(o->optim.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o->optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(o->optim.eps, 1e-6);
  EXPECT_EQ(o->optim.total_steps, 500);
  EXPECT_EQ(o->checkpoint_every, 50);
  EXPECT_EQ(o->checkpoint_keep, 4);
  EXPECT_TRUE(o->checkpoint_dir.empty());
}

TEST(RunOptionsTest, RefusesWhatItCannotHonourByField) {
  // B = 12 has no default gamma (ParseRunSpec refuses such a file too; a spec built in code can
  // still reach here).
  config::RunSpec b12 = Parse("drafter: {block_size: 12}\nloss: {gamma: 5}\n");
  b12.loss.gamma.reset();
  auto no_gamma = LocalRunOptionsFor(b12, 10);
  ASSERT_FALSE(no_gamma.ok());
  EXPECT_NE(no_gamma.status().message().find("loss.gamma"), std::string::npos) << no_gamma.status();
  auto with_gamma = LocalRunOptionsFor(Parse("drafter: {block_size: 12}\nloss: {gamma: 5}\n"), 10);
  ASSERT_TRUE(with_gamma.ok()) << with_gamma.status();
  EXPECT_DOUBLE_EQ(with_gamma->loss.gamma, 5.0);
  auto no_steps = LocalRunOptionsFor(Parse(""), 0);
  ASSERT_FALSE(no_steps.ok());
  EXPECT_NE(no_steps.status().message().find("total_steps"), std::string::npos)
      << no_steps.status();
}

}  // namespace
}  // namespace dflash::train

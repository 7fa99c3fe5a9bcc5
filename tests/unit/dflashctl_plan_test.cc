// `dflashctl plan --local` (services/dflashctl/plan_local.h): the memory plan of a run.yaml
// without a coordinator, against a GPU size from the command line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/dflashctl/commands.h"
#include "services/dflashctl/plan_local.h"

namespace dflash::ctl {
namespace {

using ::testing::HasSubstr;

struct Result {
  int code;
  std::string out, err;
};

class PlanLocalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test: ctest runs them as separate processes at once.
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("dflashctl_plan_test.") +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The Qwen3-8B-shaped pipeline of scripts/bench/pipeline.sh: 8192 tokens, 512 anchors, 5 layers.
  std::string Yaml(const std::string& extra = "",
                   const std::string& drafter = "{layers: 5, block_size: 16}") {
    const std::string path = (dir_ / "run.yaml").string();
    std::ofstream(path) << "name: p\nseed: 1\n"
                           "target: {path: \"builtin:qwen3-8b-random\", dtype: bfloat16}\n"
                        << "drafter: " << drafter
                        << "\n"
                           "data: {train: \"builtin:long-synthetic\", max_length: 2048}\n"
                           "batching: {token_budget: 8192, max_anchors: 512, grad_accum: 1}\n"
                           "optim: {lr: 6.0e-4, max_steps: 10}\n"
                        << extra;
    return path;
  }

  Result Plan(const std::string& path, double gpu_gib, const std::string& layout = "one_gpu",
              bool json = false, bool largest = false) {
    LocalPlanArgs a;
    a.run_yaml = path;
    a.gpu_gib = gpu_gib;
    a.layout = layout;
    a.json = json;
    a.largest = largest;
    std::ostringstream out, err;
    const int code = PlanLocal(a, out, err);
    return {code, out.str(), err.str()};
  }

  std::filesystem::path dir_;
};

TEST_F(PlanLocalTest, WithoutAGpuSizeItPlansAndChecksNothing) {
  const Result r = Plan(Yaml(), 0);
  EXPECT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("# planned here (--local): the target and the drafter on one GPU"));
  EXPECT_THAT(r.out, HasSubstr("no --gpu_gib: not checked against a GPU"));
  EXPECT_THAT(r.out, HasSubstr("memory plan: 8192 tokens, 512 anchors, transport cuda_ipc"));
  EXPECT_THAT(r.out, HasSubstr("drafter worker"));
  EXPECT_EQ(r.err, "");
}

// Each worker fits 24 GiB alone, the pair sharing it does not (the pipeline's pair needs about 39
// GiB: docs/benchmarks.md): refused with the shared GPU's message and its fix; 80 GiB fits.
TEST_F(PlanLocalTest, APairSharingOneGpuIsCheckedTogether) {
  const Result small = Plan(Yaml(), 24);
  EXPECT_EQ(small.code, kDoesNotFit);
  EXPECT_THAT(small.err,
              HasSubstr("dflashctl: does not fit: memory plan: the target and drafter workers "
                        "sharing one GPU (--gpu_gib 24) need"));
  EXPECT_THAT(small.out, HasSubstr("of 24.00 (fits)"));  // each alone
  const Result large = Plan(Yaml(), 80);
  EXPECT_EQ(large.code, kOk) << large.err;
  EXPECT_EQ(large.err, "");
  // On two GPUs the features go over nccl and only each worker's own total counts.
  const Result two = Plan(Yaml(), 24, "two_gpus");
  EXPECT_EQ(two.code, kOk) << two.err;
  EXPECT_THAT(two.out, HasSubstr("transport nccl"));
}

TEST_F(PlanLocalTest, AWorkerAboveItsGpuNamesTheSettingThatFits) {
  const Result r = Plan(Yaml(), 16, "two_gpus");
  EXPECT_EQ(r.code, kDoesNotFit);
  EXPECT_THAT(r.err, HasSubstr("memory plan: the drafter worker (--gpu_gib 16) needs"));
  EXPECT_THAT(r.err, HasSubstr(" fits"));
  EXPECT_THAT(r.out, HasSubstr("DOES NOT FIT"));
}

TEST_F(PlanLocalTest, JsonHasThePlanTheLayoutAndTheProblems) {
  const Result r = Plan(Yaml(), 24, "one_gpu", /*json=*/true);
  EXPECT_EQ(r.code, kDoesNotFit);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["local"]["layout"], "one_gpu");
  EXPECT_EQ(j["local"]["gpu_bytes"], int64_t{24} << 30);
  EXPECT_EQ(j["transport"], "cuda_ipc");
  ASSERT_EQ(j["problems"].size(), 1u);
  EXPECT_GT(j["drafter"]["allocator_peak_bytes"].get<int64_t>(), 0);
}

TEST_F(PlanLocalTest, BadInputIsNamed) {
  const Result bad = Plan(Yaml("placement: {pairs: 0}\n"), 80);
  EXPECT_EQ(bad.code, kInvalidConfig);
  EXPECT_THAT(bad.err, HasSubstr("placement.pairs"));
  EXPECT_EQ(Plan((dir_ / "missing.yaml").string(), 80).code, kInvalidConfig);
  // What submit refuses against the target is refused here too, before a plan of a run that
  // cannot start (a selector top-k above the vocabulary planned 3,316 GiB of selector scores).
  const Result top_k =
      Plan(Yaml("", "{kind: dflash2, selector_top_k: 200000, layers: 5, block_size: 16}"), 80);
  EXPECT_EQ(top_k.code, kInvalidConfig);
  EXPECT_THAT(top_k.err, HasSubstr("drafter.selector_top_k: 200000 is above the target's "
                                   "vocabulary of 151936 tokens"));
  EXPECT_EQ(top_k.out, "");
  const Result group =
      Plan(Yaml("", "{kind: dflash2, conv_group_size: 3, layers: 5, block_size: 16}"), 80);
  EXPECT_EQ(group.code, kInvalidConfig);
  EXPECT_THAT(group.err, HasSubstr("drafter.conv_group_size: 3 does not divide"));
  const Result tp = Plan(Yaml("placement: {target_parallel: 3}\n"), 80);
  EXPECT_EQ(tp.code, kInvalidConfig);
  EXPECT_THAT(tp.err, HasSubstr("placement.target_parallel: "));
  const Result layout = Plan(Yaml(), 80, "three_gpus");
  EXPECT_EQ(layout.code, kUsage);
  EXPECT_THAT(layout.err, HasSubstr("--layout must be one_gpu or two_gpus"));
}

// --largest: the largest budget per worker on two GPUs (the pair's is the smaller), for the pair on
// one; in the table and the JSON, from plan::LargestTokenBudget (tested in memory_plan_test).
TEST_F(PlanLocalTest, LargestGivesTheBudgetThatFitsPerWorkerOrForThePair) {
  const Result two = Plan(Yaml(), 40, "two_gpus", /*json=*/false, /*largest=*/true);
  EXPECT_EQ(two.code, kOk) << two.err;
  EXPECT_THAT(two.out, HasSubstr("largest batches that fit (batching.max_anchors scaled with the "
                                 "budget: 512 per 8192 tokens):\n"));
  EXPECT_THAT(two.out, HasSubstr("  target worker, 40.00 GiB: batching.token_budget "));
  EXPECT_THAT(two.out, HasSubstr("  drafter worker, 40.00 GiB: batching.token_budget "));
  EXPECT_THAT(two.out, HasSubstr("  the pair: batching.token_budget "));
  const Result json = Plan(Yaml(), 40, "two_gpus", /*json=*/true, /*largest=*/true);
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["largest"].size(), 2u);
  EXPECT_EQ(j["largest"][0]["who"], "target worker");
  EXPECT_EQ(j["largest"][0]["capacity_bytes"], int64_t{40} << 30);
  const int64_t drafter = j["largest"][1]["token_budget"].get<int64_t>();
  EXPECT_GT(drafter, 8192);  // the drafter of 8192 tokens fits 40 GiB with room
  EXPECT_LE(j["largest"][1]["device_bytes"].get<int64_t>(), int64_t{40} << 30);
  EXPECT_EQ(j["largest"][1]["max_anchors"].get<int64_t>(), drafter / 16);
  EXPECT_THAT(two.out, HasSubstr(absl::StrCat("drafter worker, 40.00 GiB: batching.token_budget ",
                                              drafter, ", max_anchors ", drafter / 16)));

  // The pair on one 24 GiB GPU: the target's weights and the drafter's state leave no budget.
  const Result one = Plan(Yaml(), 24, "one_gpu", /*json=*/false, /*largest=*/true);
  EXPECT_EQ(one.code, kDoesNotFit);
  EXPECT_THAT(one.out, HasSubstr("  target and drafter on one GPU, 24.00 GiB: none (not even "
                                 "batching.token_budget 2048, data.max_length's floor)"));
  const Result big = Plan(Yaml(), 80, "one_gpu", /*json=*/false, /*largest=*/true);
  EXPECT_THAT(big.out,
              HasSubstr("  target and drafter on one GPU, 80.00 GiB: batching.token_budget "));

  const Result no_size = Plan(Yaml(), 0, "one_gpu", /*json=*/false, /*largest=*/true);
  EXPECT_EQ(no_size.code, kUsage);
  EXPECT_THAT(no_size.err, HasSubstr("--largest needs --gpu_gib"));
}

}  // namespace
}  // namespace dflash::ctl

// A tensor-parallel target through the real processes on the CPU:
// placement.target_parallel: 2 places two target workers and one drafter as one pair; the target
// ranks sum their partial layer outputs through shared memory, rank 0 alone sends features, and
// the run trains on the loss curve of the same run with one target process (within fp32 rounding:
// the sums run in another order). A killed rank pauses the run, which resumes from its checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/training_cluster.h"

namespace dflash::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using ms = std::chrono::milliseconds;

std::string Yaml(const char* name, int target_parallel) {
  return absl::StrCat("name: ", name,
                      "\nseed: 7\n"
                      "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                      "drafter: {layers: 1, block_size: 8}\n"
                      "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                      "batching: {token_budget: 512, max_anchors: 64}\n"
                      "optim: {lr: 2.0e-2, max_steps: 12}\n"
                      "placement: {pairs: 1, transport: host, target_parallel: ",
                      target_parallel,
                      "}\n"
                      "checkpoint: {every_steps: 4, keep: 1}\n");
}

TEST_F(TrainingCluster, ATensorParallelTargetTrainsOnTheOneProcessCurveAndSurvivesAKill) {
  StartWorker("target", "t0");
  StartWorker("target", "t1");
  StartWorker("drafter", "d0");
  CtlResult one = RunCtl(address_, {"submit", WriteRunYaml("one.yaml", Yaml("one", 1))});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  CtlResult two = RunCtl(address_, {"submit", WriteRunYaml("two.yaml", Yaml("two", 2))});
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_THAT(two.out, HasSubstr("placed on 1 pair(s): t0|t1+d0"));
  EXPECT_THAT(two.out, HasSubstr("running -> done: trained 12 steps"));
  json runs = json::parse(RunCtl(address_, {"list", "-o", "json"}).out)["runs"];
  std::map<std::string, std::string> ids;
  for (const json& r : runs) ids[r["name"]] = r["run_id"];
  const std::map<int64_t, double> want = Losses(ids["one"]), got = Losses(ids["two"]);
  ASSERT_EQ(want.size(), 12u);
  ASSERT_EQ(got.size(), 12u);
  double worst = 0;
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got.at(step), loss, 1e-4 * std::abs(loss)) << "step " << step;
    worst = std::max(worst, std::abs(got.at(step) - loss) / std::abs(loss));
  }
  std::printf(
      "loss step 0 %.6f -> step 11 %.6f (one process %.6f -> %.6f); largest relative "
      "difference %.3g\n",
      got.at(0), got.at(11), want.at(0), want.at(11), worst);
  EXPECT_LT(got.at(11), got.at(0));
  const std::string run_dir = Status(ids["two"])["run_dir"];
  EXPECT_THAT(ReadFile(run_dir + "/logs/target-t1.log"),
              HasSubstr("tensor-parallel rank 1 of 2 (host)"));
  EXPECT_THAT(ReadFile(run_dir + "/logs/target-t0.log"), HasSubstr("channel"));

  // Rank 1 is killed after step 5: rank 0, blocked in an all-reduce, is released (its group
  // aborted); the run pauses, waits for two target processes again and resumes from step 4's
  // checkpoint on the same curve.
  const std::string again = Submit(WriteRunYaml("again.yaml", Yaml("again", 2)));
  ASSERT_TRUE(WaitFor([&] { return Losses(again).size() >= 6; }, ms(60000)));
  workers_["t1"]->Signal(SIGKILL);
  workers_["t1"]->Wait();
  ASSERT_TRUE(WaitFor([&] { return Status(again)["state"] == "RUN_STATE_QUEUED"; }, ms(20000)))
      << Status(again).dump();
  StartWorker("target", "t1");
  ASSERT_TRUE(WaitFor([&] { return Status(again)["state"] == "RUN_STATE_DONE"; }, ms(60000)))
      << Status(again).dump() << ReadFile(dir_ + "/coordinator.log");
  EXPECT_THAT(ReadFile(dir_ + "/coordinator.log"), HasSubstr("resuming at step "));
  const std::map<int64_t, double> resumed = Losses(again);
  ASSERT_EQ(resumed.size(), 12u);
  for (const auto& [step, loss] : got) EXPECT_EQ(resumed.at(step), loss) << "step " << step;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Tensor-parallel decoding: a run with placement.target_parallel 2 evaluates during training on
// its two target ranks (each decodes with its shard over a group of its own while the run's group
// carries the steps); `dflashctl eval` and `regen` with target_parallel 2 run on a group of two
// idle targets and give what one target gives (fp32 on the CPU: the same greedy tokens).
TEST_F(TrainingCluster, ATensorParallelTargetEvaluatesAndRegeneratesAsOneProcessDoes) {
  StartWorker("target", "t0");
  StartWorker("target", "t1");
  StartWorker("drafter", "d0");
  const std::string eval_yaml =
      "eval: {every_steps: 4, prompts: \"builtin:tiny-chat\", max_prompts: 3, "
      "max_new_tokens: 16}\n";
  const std::string two = WriteRunYaml("two.yaml", Yaml("two", 2) + eval_yaml);
  CtlResult r = RunCtl(address_, {"submit", two});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("running -> done: trained 12 steps"));
  json runs = json::parse(RunCtl(address_, {"list", "-o", "json"}).out)["runs"];
  ASSERT_EQ(runs.size(), 1u);
  const std::string id = runs[0]["run_id"];
  const std::string run_dir = Status(id)["run_dir"];
  const std::vector<std::string> evals = Lines(run_dir + "/eval/results.jsonl");
  ASSERT_EQ(evals.size(), 3u) << ReadFile(dir_ + "/coordinator.log");
  for (const std::string& line : evals) {
    const json e = json::parse(line);
    EXPECT_EQ(e["worker"], "t0|t1") << line;
    EXPECT_GT(e["tau"].get<double>(), 0.0) << line;
  }
  EXPECT_THAT(ReadFile(run_dir + "/logs/target-t1.log"), HasSubstr("rank 1 of 2: evaluated"));

  // The exported drafter, evaluated by the group and by one target.
  ASSERT_EQ(RunCtl(address_, {"export", id, "--out", dir_ + "/drafter"}).exit_code, 0);
  const std::string one = WriteRunYaml("one.yaml", Yaml("one", 1) + eval_yaml);
  CtlResult by_two = RunCtl(address_, {"eval", two, "--drafter", dir_ + "/drafter", "-o", "json"});
  CtlResult by_one = RunCtl(address_, {"eval", one, "--drafter", dir_ + "/drafter", "-o", "json"});
  ASSERT_EQ(by_two.exit_code, 0) << by_two.err;
  ASSERT_EQ(by_one.exit_code, 0) << by_one.err;
  const json a = json::parse(by_two.out), b = json::parse(by_one.out);
  EXPECT_EQ(a["worker"], "t0|t1");
  EXPECT_EQ(a["new_tokens"], b["new_tokens"]);
  EXPECT_EQ(a["verifications"], b["verifications"]);
  EXPECT_DOUBLE_EQ(a["tau"].get<double>(), b["tau"].get<double>());
  EXPECT_EQ(a["baseline_identical_prompts"], a["prompts"]) << by_two.out;

  // Regeneration: the same answers, greedy.
  for (const auto& [yaml, out] :
       {std::make_pair(two, dir_ + "/two.jsonl"), std::make_pair(one, dir_ + "/one.jsonl")}) {
    CtlResult g = RunCtl(address_, {"-o", "json", "regen", yaml, "--out", out, "--max_records", "6",
                                    "--max_new_tokens", "12"});
    ASSERT_EQ(g.exit_code, 0) << g.err;
  }
  ASSERT_EQ(Lines(dir_ + "/two.jsonl").size(), 6u);
  EXPECT_EQ(Lines(dir_ + "/two.jsonl"), Lines(dir_ + "/one.jsonl"));
  EXPECT_THAT(ReadFile(dir_ + "/coordinator.log"), HasSubstr("groups of 2 workers)"));
}

TEST_F(TrainingCluster, ATensorParallelWidthTheTargetCannotSplitIsRefusedAtSubmit) {
  // builtin:tiny-qwen3 has 4 attention heads.
  CtlResult r = RunCtl(address_, {"submit", WriteRunYaml("three.yaml", Yaml("three", 3))});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("placement.target_parallel: tensor parallelism over 3 processes: "
                               "num_attention_heads 4 is not a multiple of 3"));
}

}  // namespace
}  // namespace dflash::testing

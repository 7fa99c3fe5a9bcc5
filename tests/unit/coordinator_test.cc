// The coordinator's logic with a fake clock and fake workers: no threads, no sockets, no sleeps.
#include "services/coordinator/coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/coordinator/coordinator_service.h"
#include "tests/unit/coordinator_fixture.h"

namespace dflash::coordinator {
namespace {

using ::testing::HasSubstr;

TEST_F(CoordinatorTest, SubmitValidatesAndStoresResolvedConfig) {
  auto bad = coordinator_->SubmitRun("name: x\nbatching: {token_budget: 0}\n", "bad.yaml", false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad.yaml: target: required"));
  auto run = coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->state(), v1::RUN_STATE_QUEUED);
  EXPECT_THAT(run->run_id(), ::testing::StartsWith("unit-"));
  EXPECT_THAT(run->resolved_config_yaml(), HasSubstr("gamma: 7.0"));
  auto dry = coordinator_->SubmitRun(kRunYaml, "run.yaml", true);
  ASSERT_TRUE(dry.ok());
  EXPECT_EQ(dry->run_id(), "");
  EXPECT_EQ(coordinator_->ListRuns()->size(), 1u);
}

// What the workers would refuse only when the run starts is refused at submit, naming the field:
// feature layers that repeat (a target too shallow for the default rule), a mask token `auto` does
// not know; evaluations with a hybrid target are accepted (it generates and verifies).
TEST_F(CoordinatorTest, TargetChecksAtSubmitNameTheField) {
  const std::string dir = state_dir_ + "/qwen3_5";
  std::filesystem::create_directories(dir);
  auto write_config = [&](int layers) {
    std::ofstream(dir + "/config.json")
        << R"({"model_type": "qwen3_5", "text_config": {"vocab_size": 512, "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_hidden_layers": )"
        << layers << "}}";
  };
  std::string yaml = kRunYaml;
  yaml.replace(yaml.find("builtin:tiny-qwen3"), std::string("builtin:tiny-qwen3").size(), dir);
  auto submit = [&](const std::string& extra) {
    return coordinator_->SubmitRun(yaml + extra, "hybrid.yaml", false);
  };
  write_config(8);
  auto eval = submit(
      "drafter: {mask_token_id: 1}\neval: {every_steps: 2, prompts: \"builtin:tiny-chat\"}\n");
  EXPECT_TRUE(eval.ok()) << eval.status();  // hybrid targets generate and verify since 2026-12-06
  auto mask = submit("");
  ASSERT_FALSE(mask.ok());
  EXPECT_THAT(std::string(mask.status().message()),
              HasSubstr("hybrid.yaml: drafter.mask_token_id: auto found no mask token for the "
                        "qwen3_5 target with 512 tokens"));
  EXPECT_TRUE(submit("drafter: {mask_token_id: 1}\n").ok());
  write_config(4);
  auto shallow = submit("drafter: {mask_token_id: 1}\n");
  ASSERT_FALSE(shallow.ok());
  EXPECT_THAT(std::string(shallow.status().message()),
              HasSubstr("hybrid.yaml: target.layer_ids: auto gives 1,1,1,1,1 for a target of 4 "
                        "layers: ids repeat"));
}

// What the target's shapes cannot take (run::CheckRunTargetShapes) is refused by plan as by
// submit, naming the field: plan had printed the plan of such a run (a DFlash2 selector top-k above
// the vocabulary: thousands of GiB of candidate scores).
TEST_F(CoordinatorTest, PlanRefusesWhatSubmitRefusesAgainstTheTarget) {
  constexpr char kTopK[] = R"(
name: topk
target: {path: "builtin:qwen3-8b-random"}
drafter: {kind: dflash2, selector_top_k: 200000}
data: {train: "builtin:long-synthetic", max_length: 2048}
batching: {token_budget: 8192, max_anchors: 512}
optim: {max_steps: 5}
)";
  for (const auto& refused : {coordinator_->PlanRun(kTopK).status(),
                              coordinator_->SubmitRun(kTopK, "topk.yaml", false).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(std::string(refused.message()),
                HasSubstr("drafter.selector_top_k: 200000 is above the target's vocabulary of "
                          "151936 tokens"));
  }
}

// An evaluation prompt that cannot fit the target's positions with its answer and a block fails
// the run before its first step, naming where the prompt came from: nothing is generated half-way.
TEST_F(CoordinatorTest, EvalPromptsLongerThanTheTargetsPositionsFailTheRunNamingThePrompt) {
  const std::string dir = state_dir_ + "/short";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << R"({"model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 8, "max_position_embeddings": 64})";
  std::string yaml = kRunYaml;
  yaml.replace(yaml.find("builtin:tiny-qwen3"), std::string("builtin:tiny-qwen3").size(), dir);
  auto run = coordinator_->SubmitRun(
      yaml +
          "drafter: {mask_token_id: 1}\n"
          "eval: {every_steps: 2, prompts: \"builtin:tiny-chat\", max_new_tokens: 60}\n",
      "short.yaml", false);
  ASSERT_TRUE(run.ok()) << run.status();
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  coordinator_->Tick();
  const v1::RunStatus after = *coordinator_->GetRun(run->run_id());
  EXPECT_EQ(after.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(after.message(), HasSubstr("eval.prompts: builtin:tiny-chat document "));
  EXPECT_THAT(after.message(), HasSubstr(" prompt tokens + eval.max_new_tokens 60 + a block of "));
  EXPECT_THAT(after.message(), HasSubstr("exceed the target's max_position_embeddings 64"));
  EXPECT_TRUE(workers_.steps.empty());
}

TEST_F(CoordinatorTest, QueuedRunWaitsForAPairThenStartsAndStopsHonestly) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  std::string t = AddWorker("t0", v1::WORKER_ROLE_TARGET);
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_QUEUED);  // no drafter yet
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  coordinator_->Tick();
  EXPECT_THAT(workers_.prepared,
              ::testing::ElementsAre(t + ":" + run.run_id(), d + ":" + run.run_id()));
  auto after = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(after.state(), v1::RUN_STATE_DONE) << after.message();
  EXPECT_THAT(History(run.run_id()),
              ::testing::ElementsAre(v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING,
                                     v1::RUN_STATE_RUNNING, v1::RUN_STATE_DONE));
  // Every step went to both workers, in order, and was committed once.
  ASSERT_EQ(workers_.steps.size(), 10u);
  for (int step = 0; step < 5; ++step) {
    EXPECT_THAT(workers_.steps, ::testing::Contains(t + ":" + std::to_string(step)));
    EXPECT_THAT(workers_.steps, ::testing::Contains(d + ":" + std::to_string(step)));
  }
  EXPECT_EQ(after.step(), 5);
  EXPECT_EQ(after.total_steps(), 5);
  // target.layer_ids and drafter.mask_token_id auto, resolved at submit and at the run's start.
  for (const v1::RunStatus& r : {run, after}) {
    EXPECT_THAT(r.resolved_target().target_layer_ids(), ::testing::ElementsAre(1, 2, 3, 4, 5));
    EXPECT_EQ(r.resolved_target().mask_token_id(), 1);
    EXPECT_EQ(r.resolved_target().mask_token_rule(), "the built-in target's");
  }
  EXPECT_EQ(after.last_step().step(), 4);
  EXPECT_DOUBLE_EQ(after.last_step().loss(), 5.0 - 0.04);
  EXPECT_GT(after.last_step().tokens(), 0);
  EXPECT_EQ(after.run_dir(),
            (std::filesystem::absolute(state_dir_) / "runs" / run.run_id()).string());
  EXPECT_TRUE(std::filesystem::exists(after.run_dir() + "/run.yaml"));
  // The target gets the pieces, the drafter the anchors, under the same batch ids; the drafter
  // is asked for checkpoints at steps 2 and 4 and the last (5), and the export at the end.
  std::vector<std::string> checkpoints;
  for (const auto& req : workers_.requests) {
    ASSERT_EQ(req.micro_batches_size(), 2);
    for (const auto& mb : req.micro_batches()) {
      EXPECT_EQ(mb.batch_id() >> 20, static_cast<uint64_t>(req.step() + 1));
      EXPECT_GT(mb.tokens(), 0);
    }
    if (!req.checkpoint_path().empty()) {
      checkpoints.push_back(std::filesystem::path(req.checkpoint_path()).filename().string());
      EXPECT_EQ(req.checkpoint_metadata().count("data.cursor"), 1u);
    }
    EXPECT_EQ(!req.export_dir().empty(),
              req.step() == 4 && req.micro_batches(0).anchors_size() > 0);
  }
  EXPECT_THAT(checkpoints, ::testing::ElementsAre("step-000000000002.safetensors",
                                                  "step-000000000004.safetensors",
                                                  "step-000000000005.safetensors"));
  EXPECT_EQ(workers_.released.size(), 2u);
  for (const auto& w : coordinator_->ListWorkers()) EXPECT_EQ(w.run_id(), "");
}

TEST_F(CoordinatorTest, EvaluationsDuringTrainingAreRecordedAndOnDemandUsesAnIdleTarget) {
  auto run = *coordinator_->SubmitRun(
      absl::StrCat(kRunYaml,
                   "eval: {every_steps: 2, prompts: \"builtin:tiny-chat\", max_prompts: 3, "
                   "max_new_tokens: 8}\n"),
      "run.yaml", false);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  coordinator_->Tick();
  auto after = *coordinator_->GetRun(run.run_id());
  ASSERT_EQ(after.state(), v1::RUN_STATE_DONE) << after.message();
  // After steps 2 and 4 the drafter exports a snapshot, after the last (5) the run's export; the
  // target decodes each with the run's prompts.
  const std::string dir = after.run_dir();
  ASSERT_EQ(workers_.eval_requests.size(), 3u);
  EXPECT_EQ(workers_.eval_requests[0].drafter_dir(), dir + "/eval/step-000000000002");
  EXPECT_EQ(workers_.eval_requests[1].drafter_dir(), dir + "/eval/step-000000000004");
  EXPECT_EQ(workers_.eval_requests[2].drafter_dir(), dir + "/export");
  for (const auto& req : workers_.eval_requests) {
    EXPECT_EQ(req.prompts_size(), 3);
    EXPECT_EQ(req.max_new_tokens(), 8);
    EXPECT_EQ(req.run_id(), run.run_id());
    for (const auto& p : req.prompts()) EXPECT_GT(p.ids_size(), 0);
  }
  std::map<int64_t, std::string> exports;
  for (const auto& req : workers_.requests) {
    if (!req.export_dir().empty()) exports[req.step()] = req.export_dir();
  }
  EXPECT_EQ(exports.size(), 3u);
  EXPECT_EQ(exports[1], dir + "/eval/step-000000000002");
  EXPECT_EQ(exports[4], dir + "/export");
  // The newest evaluation in the run's status; each in the run's evaluation log.
  ASSERT_TRUE(after.has_last_eval());
  EXPECT_EQ(after.last_eval().step(), 5);
  EXPECT_DOUBLE_EQ(after.last_eval().tau(), 3.0);  // the fake accepts 2 of 3 proposals
  EXPECT_THAT(after.last_eval().acceptance_by_position(), ::testing::ElementsAre(1, 1, 1, 0));
  EXPECT_EQ(after.last_eval().worker(), "t0");
  EXPECT_DOUBLE_EQ(after.last_step().measured_acceptance_length(), 3.0);
  std::ifstream log(dir + "/eval/results.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line);) ++lines;
  EXPECT_EQ(lines, 3);

  // On demand, on the (now idle) target; the drafter directory must exist.
  v1::EvaluateDrafterRequest req;
  req.set_run_yaml(kRunYaml);
  req.set_drafter_dir(dir + "/export");
  req.set_prompts("builtin:tiny-chat");
  req.set_max_prompts(2);
  auto missing = coordinator_->EvaluateDrafter(req);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("drafter.init_from"));
  std::filesystem::create_directories(dir + "/export");
  auto r = coordinator_->EvaluateDrafter(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->worker(), "t0");
  EXPECT_DOUBLE_EQ(r->tau(), 3.0);
  EXPECT_EQ(workers_.eval_requests.back().prompts_size(), 2);
  EXPECT_EQ(workers_.eval_requests.back().max_new_tokens(), 256);  // eval.max_new_tokens default
}

// An evaluation during training does not hold the steps: while pair 0's target decodes the
// snapshot of step 2, step 3 is committed and the run's status says which worker evaluates what;
// the step that exports the next snapshot waits for it (its end prunes snapshot directories).
TEST_F(CoordinatorTest, TrainingGoesOnWhileASnapshotIsEvaluated) {
  auto run = *coordinator_->SubmitRun(
      absl::StrCat(kRunYaml,
                   "eval: {every_steps: 2, prompts: \"builtin:tiny-chat\", max_prompts: 3, "
                   "max_new_tokens: 8}\n"),
      "run.yaml", false);
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  int evaluations = 0;
  workers_.on_evaluate = [&] {  // the first evaluation decodes until the test lets it end
    std::unique_lock<std::mutex> lock(m);
    if (++evaluations == 1) cv.wait(lock, [&] { return release; });
  };
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  std::thread trainer([&] { coordinator_->Tick(); });  // inline_steps: trains inside Tick
  v1::RunStatus seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    seen = *coordinator_->GetRun(run.run_id());
    if (seen.has_evaluating() && seen.step() >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(seen.step(), 3) << "steps committed while step 2's snapshot was evaluated";
  ASSERT_TRUE(seen.has_evaluating());
  EXPECT_EQ(seen.evaluating().step(), 2);
  EXPECT_EQ(seen.evaluating().worker(), "t0");
  EXPECT_EQ(seen.evaluating().drafter_dir(), seen.run_dir() + "/eval/step-000000000002");
  {
    std::lock_guard<std::mutex> lock(m);
    release = true;
  }
  cv.notify_all();
  trainer.join();
  const v1::RunStatus after = *coordinator_->GetRun(run.run_id());
  ASSERT_EQ(after.state(), v1::RUN_STATE_DONE) << after.message();
  EXPECT_FALSE(after.has_evaluating());
  EXPECT_EQ(workers_.eval_requests.size(), 3u);
  EXPECT_EQ(after.last_eval().step(), 5);
  EXPECT_DOUBLE_EQ(after.last_step().measured_acceptance_length(), 3.0);  // the last one's
}

// A tensor-parallel target on GPUs evaluates between the steps (docs/models.md): its decoding
// group's NCCL collectives must not run beside the run's group's. No target runs ahead of a step
// whose snapshot is evaluated, the steps wait for the evaluation, the status says so, and every
// rank gets the request with the group that rank 0 opened.
TEST_F(CoordinatorTest, ATensorParallelGpuTargetEvaluatesBetweenSteps) {
  auto run = *coordinator_->SubmitRun(
      absl::StrCat(kRunYaml,
                   "placement: {target_parallel: 2}\n"
                   "eval: {every_steps: 2, prompts: \"builtin:tiny-chat\", max_prompts: 3, "
                   "max_new_tokens: 8}\n"),
      "run.yaml", false);
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  std::vector<int64_t> dispatched_at_eval;  // the highest step dispatched when each rank decodes
  workers_.on_evaluate = [&] {
    const int64_t highest = workers_.HighestStep();
    std::unique_lock<std::mutex> lock(m);
    dispatched_at_eval.push_back(highest);
    if (dispatched_at_eval.size() <= 2) cv.wait(lock, [&] { return release; });
  };
  AddGpuWorker("t0", v1::WORKER_ROLE_TARGET, 0);
  AddGpuWorker("t1", v1::WORKER_ROLE_TARGET, 1);
  AddGpuWorker("d0", v1::WORKER_ROLE_DRAFTER, 2);
  std::thread trainer([&] { coordinator_->Tick(); });
  v1::RunStatus seen = WaitUntilEvaluating(run.run_id());
  ASSERT_TRUE(seen.has_evaluating());
  EXPECT_TRUE(seen.evaluating().between_steps());
  EXPECT_EQ(seen.evaluating().worker(), "t0|t1");
  EXPECT_EQ(seen.evaluating().step(), 2);
  // The evaluation of step 2's snapshot can show on the status a moment before step 1's commit
  // (seen once in 75 runs under load: step 1): wait for the commit, the evaluation still held.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (seen.step() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    seen = *coordinator_->GetRun(run.run_id());
  }
  EXPECT_TRUE(seen.has_evaluating());
  EXPECT_EQ(seen.step(), 2) << "the steps wait for the evaluation";
  {
    std::lock_guard<std::mutex> lock(m);
    release = true;
  }
  cv.notify_all();
  trainer.join();
  const v1::RunStatus after = *coordinator_->GetRun(run.run_id());
  ASSERT_EQ(after.state(), v1::RUN_STATE_DONE) << after.message();
  EXPECT_EQ(after.last_eval().worker(), "t0|t1");
  // Three evaluations (steps 2, 4 and the export), each by both ranks: no step past the one
  // whose snapshot they decode had been dispatched.
  ASSERT_EQ(dispatched_at_eval.size(), 6u);
  EXPECT_THAT(dispatched_at_eval, ::testing::ElementsAre(1, 1, 3, 3, 4, 4));
  ASSERT_EQ(workers_.eval_requests.size(), 6u);
  EXPECT_EQ(workers_.opened_groups.size(), 3u);
  for (const v1::EvaluateRequest& r : workers_.eval_requests) {
    EXPECT_EQ(r.group().world(), 2);
    EXPECT_EQ(r.group().collective(), "nccl");
    EXPECT_EQ(r.group().nccl_unique_id(), "group-of-t0");
  }
}

// eval.worker auto with a tensor-parallel target on GPUs and one more idle target group: the run
// reserves that group for its evaluations, which decode there while the steps go on (the first
// evaluation, of step 2's snapshot, waits until step 4 has been dispatched), and it is the run's
// until the run ends. eval.worker reserved without an idle group waits queued, saying why.
TEST_F(CoordinatorTest, AReservedGroupEvaluatesBesideTheSteps) {
  const std::string eval = absl::StrCat(
      kRunYaml,
      "placement: {target_parallel: 2}\n"
      "eval: {every_steps: 2, prompts: \"builtin:tiny-chat\", max_prompts: 3, max_new_tokens: "
      "8");
  std::mutex m;
  std::condition_variable cv;
  bool observed = false;                    // the test has seen the evaluation on the status
  std::vector<int64_t> dispatched_at_eval;  // the highest step dispatched when each rank decodes
  auto highest = [&] { return workers_.HighestStep(); };
  workers_.on_evaluate = [&] {
    // The first evaluation (both ranks) stays in progress until the test has seen it and the
    // steps have gone on to step 3 without it (at most 20 s; the steps do not signal, so polled).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::unique_lock<std::mutex> lock(m);
    const bool first = dispatched_at_eval.size() < 2;
    while (first && !(observed && highest() >= 3) && std::chrono::steady_clock::now() < deadline) {
      cv.wait_for(lock, std::chrono::milliseconds(1));
    }
    dispatched_at_eval.push_back(highest());
  };
  AddGpuWorker("t0", v1::WORKER_ROLE_TARGET, 0);
  AddGpuWorker("t1", v1::WORKER_ROLE_TARGET, 1);
  AddGpuWorker("d0", v1::WORKER_ROLE_DRAFTER, 2);
  const std::string t2 = AddGpuWorker("t2", v1::WORKER_ROLE_TARGET, 3);
  auto waiting =
      *coordinator_->SubmitRun(absl::StrCat(eval, ", worker: reserved}\n"), "run.yaml", false);
  coordinator_->Tick();
  v1::RunStatus seen = *coordinator_->GetRun(waiting.run_id());
  EXPECT_EQ(seen.state(), v1::RUN_STATE_QUEUED);
  EXPECT_THAT(seen.message(), ::testing::HasSubstr("waiting for an idle target group (2 "
                                                   "process(es)) to reserve for evaluation"));
  ASSERT_TRUE(coordinator_->CancelRun(waiting.run_id()).ok());

  const std::string t3 = AddGpuWorker("t3", v1::WORKER_ROLE_TARGET, 4);
  auto run = *coordinator_->SubmitRun(absl::StrCat(eval, "}\n"), "run.yaml", false);
  std::thread trainer([&] { coordinator_->Tick(); });
  seen = WaitUntilEvaluating(run.run_id());
  {
    std::lock_guard<std::mutex> lock(m);
    observed = true;
  }
  cv.notify_all();
  trainer.join();
  ASSERT_TRUE(seen.has_evaluating());
  EXPECT_TRUE(seen.evaluating().reserved());
  EXPECT_FALSE(seen.evaluating().between_steps());
  EXPECT_EQ(seen.evaluating().worker(), "t2|t3");
  const v1::RunStatus after = *coordinator_->GetRun(run.run_id());
  ASSERT_EQ(after.state(), v1::RUN_STATE_DONE) << after.message();
  EXPECT_EQ(after.last_eval().worker(), "t2|t3");
  ASSERT_GE(dispatched_at_eval.size(), 2u);
  EXPECT_GE(dispatched_at_eval[0], 3) << "the steps went on beside the first evaluation";
  EXPECT_GE(dispatched_at_eval[1], 3);
  EXPECT_THAT(workers_.eval_workers, ::testing::Each(::testing::AnyOf("t2", "t3")));
  for (const v1::WorkerInfo& w : coordinator_->ListWorkers()) {
    if (w.worker_id() == t2 || w.worker_id() == t3) {
      EXPECT_EQ(w.run_id(), "") << w.name() << " is released with the run";
    }
  }
}

// The reserved group's GPUs must have the target's memory free: without it, eval.worker reserved
// waits queued saying so, and auto evaluates on pair 0's target group (between the steps) instead.
TEST_F(CoordinatorTest, AnEvaluationGroupWithoutFreeMemoryIsNotReserved) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  AddGpuWorker("t0", v1::WORKER_ROLE_TARGET, 0, 70 * kGiB);
  AddGpuWorker("t1", v1::WORKER_ROLE_TARGET, 1, 70 * kGiB);
  AddGpuWorker("d0", v1::WORKER_ROLE_DRAFTER, 2, 70 * kGiB);
  AddGpuWorker("t2", v1::WORKER_ROLE_TARGET, 3, kGiB >> 20);  // 1 KiB free
  AddGpuWorker("t3", v1::WORKER_ROLE_TARGET, 4, kGiB >> 20);
  const std::string eval = absl::StrCat(
      kRunYaml,
      "placement: {target_parallel: 2}\n"
      "eval: {every_steps: 2, prompts: \"builtin:tiny-chat\", max_prompts: 3, max_new_tokens: "
      "8");
  auto waiting =
      *coordinator_->SubmitRun(absl::StrCat(eval, ", worker: reserved}\n"), "run.yaml", false);
  coordinator_->Tick();
  v1::RunStatus seen = *coordinator_->GetRun(waiting.run_id());
  EXPECT_EQ(seen.state(), v1::RUN_STATE_QUEUED);
  EXPECT_THAT(seen.message(), HasSubstr("for evaluation (eval.worker: reserved): GPU 3 of host "
                                        "10.0.0.1"));
  ASSERT_TRUE(coordinator_->CancelRun(waiting.run_id()).ok());
  auto run = *coordinator_->SubmitRun(absl::StrCat(eval, "}\n"), "run.yaml", false);
  coordinator_->Tick();
  const v1::RunStatus after = *coordinator_->GetRun(run.run_id());
  ASSERT_EQ(after.state(), v1::RUN_STATE_DONE) << after.message();
  EXPECT_EQ(after.last_eval().worker(), "t0|t1");
  EXPECT_THAT(workers_.eval_workers, ::testing::Each(::testing::AnyOf("t0", "t1")));
}

// No exception leaves a coordinator handler (common/rpc/guarded.h): a worker call that throws
// under EvaluateDrafter is answered INTERNAL naming the operation, and the coordinator answers the
// next call.
TEST_F(CoordinatorTest, AHandlerWhoseDependencyThrowsAnswersAStatus) {
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  const std::string dir = state_dir_ + "/drafter";
  std::filesystem::create_directories(dir);
  v1::EvaluateDrafterRequest req;
  req.set_run_yaml(kRunYaml);
  req.set_drafter_dir(dir);
  req.set_prompts("builtin:tiny-chat");
  req.set_max_prompts(2);
  workers_.on_evaluate = [] { throw std::runtime_error("worker client threw"); };
  CoordinatorService service(coordinator_.get());
  grpc::ServerContext ctx;
  v1::EvaluateDrafterResponse resp;
  grpc::Status s = service.EvaluateDrafter(&ctx, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(s.error_message(), "EvaluateDrafter: worker client threw");
  v1::ListWorkersRequest list;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(service.ListWorkers(&ctx, &list, &workers).ok());
  EXPECT_EQ(workers.workers_size(), 1);
  workers_.on_evaluate = nullptr;
  EXPECT_TRUE(service.EvaluateDrafter(&ctx, &req, &resp).ok());
}

// Free memory is part of the plan: a pair whose GPU has less free than the plan needs
// waits queued with the reason as its message, and starts once the GPU reports room; what the
// pair's own allocators hold counts as room (they free or reuse it).
TEST_F(CoordinatorTest, ARunWaitsForFreeGpuMemoryAndStartsWhenItFrees) {
  constexpr uint64_t kGiB = 1ull << 30;
  std::map<std::string, std::string> ids;
  auto device = [&](uint64_t free, uint64_t reserved) {
    v1::DeviceInfo d;
    d.set_kind("cuda");
    d.set_index(0);
    d.set_total_bytes(80 * kGiB);
    d.set_free_bytes(free);
    d.set_process_reserved_bytes(reserved);
    return d;
  };
  for (const auto& [name, role] : {std::make_pair("t0", v1::WORKER_ROLE_TARGET),
                                   std::make_pair("d0", v1::WORKER_ROLE_DRAFTER)}) {
    v1::WorkerInfo w;
    w.set_name(name);
    w.set_role(role);
    w.set_control_address("10.0.0.1:100");
    *w.mutable_device() = device(kGiB / 1024, 0);
    ids[name] = coordinator_->Register(w)->worker_id();
  }
  auto beat = [&](uint64_t free, uint64_t reserved) {
    for (const auto& [name, id] : ids) {
      v1::HeartbeatRequest req;
      req.set_worker_id(id);
      *req.mutable_device() = device(free, reserved);
      ASSERT_TRUE(coordinator_->Heartbeat(req).ok());
    }
  };
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  auto waiting = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(waiting.state(), v1::RUN_STATE_QUEUED);
  EXPECT_THAT(waiting.message(), ::testing::StartsWith("GPU 0 of host 10.0.0.1: 0.0 GiB free, "
                                                       "the pair needs "));
  EXPECT_THAT(waiting.message(), HasSubstr("; held by other processes: 80.0 GiB"));
  EXPECT_TRUE(workers_.prepared.empty());
  // plan shows the same figure, and the same line as what the run would wait for.
  auto plan = coordinator_->PlanRun(kRunYaml);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->table(), HasSubstr("free now"));
  EXPECT_THAT(plan->table(), HasSubstr("(t0, d0): WOULD WAIT"));
  ASSERT_EQ(plan->waits_size(), 1);
  EXPECT_EQ(plan->waits(0), waiting.message());
  EXPECT_TRUE(plan->problems().empty());  // waiting is not a refusal
  EXPECT_THAT(plan->json(), HasSubstr("\"fits_now\": false"));
  EXPECT_THAT(plan->json(), HasSubstr("\"other_processes_bytes\": 85898297344"));
  // The workers' own allocators hold 1 GiB each of what is not free: theirs, not another's.
  beat(kGiB / 1024, kGiB);
  plan = coordinator_->PlanRun(kRunYaml);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->table(), HasSubstr("(t0, d0): fits now"));
  EXPECT_THAT(plan->table(), HasSubstr("held by other processes: 78.0 GiB"));
  EXPECT_EQ(plan->waits_size(), 0);
  coordinator_->Tick();
  auto mine = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(mine.state(), v1::RUN_STATE_DONE) << mine.message();
}

// A worker that ended (marked down) is not counted as holding its last reported memory: what the
// GPU lacks is then another process's (seen on an H100 with a new pair after an earlier one
// ended: "held by other processes: 0.0 GiB" while another process held 40.6 GiB).
TEST_F(CoordinatorTest, AWorkerMarkedDownHoldsNoMemory) {
  constexpr uint64_t kGiB = 1ull << 30;
  auto add = [&](const std::string& name, v1::WorkerRole role, uint64_t reserved) {
    v1::WorkerInfo w;
    w.set_name(name);
    w.set_role(role);
    w.set_control_address("10.0.0.1:100");
    v1::DeviceInfo* d = w.mutable_device();
    d->set_kind("cuda");
    d->set_index(0);
    d->set_total_bytes(80 * kGiB);
    d->set_free_bytes(kGiB / 1024);
    d->set_process_reserved_bytes(reserved);
    return coordinator_->Register(w)->worker_id();
  };
  add("old", v1::WORKER_ROLE_TARGET, 30 * kGiB);  // its process ended: it stops heartbeating
  clock_.AdvanceMs(5000);                         // past worker_timeout_ms (1 s)
  coordinator_->Tick();
  add("t0", v1::WORKER_ROLE_TARGET, 0);
  add("d0", v1::WORKER_ROLE_DRAFTER, 0);
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  const v1::RunStatus waiting = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(waiting.state(), v1::RUN_STATE_QUEUED);
  EXPECT_THAT(waiting.message(), HasSubstr("; held by other processes: 80.0 GiB"));
}

TEST_F(CoordinatorTest, TransportAutoIsCudaIpcForAPairOnOneGpuAndNcclOnTwo) {
  AddGpuWorker("t0", v1::WORKER_ROLE_TARGET, 0);
  AddGpuWorker("d0", v1::WORKER_ROLE_DRAFTER, 0);
  coordinator_->SubmitRun(kRunYaml, "run.yaml", false).IgnoreError();
  coordinator_->Tick();
  ASSERT_EQ(workers_.prepare_requests.size(), 2u);
  for (const auto& req : workers_.prepare_requests) {
    EXPECT_EQ(req.transport(), "cuda_ipc");
    EXPECT_EQ(req.total_steps(), 5);
    EXPECT_THAT(req.channel(), ::testing::StartsWith("dflash-unit-"));
  }
  // Another GPU for the drafter: nccl, the target's channel descriptor handed to its drafter.
  Reopen(":memory:");
  AddGpuWorker("t1", v1::WORKER_ROLE_TARGET, 1);
  AddGpuWorker("d1", v1::WORKER_ROLE_DRAFTER, 2);
  coordinator_->SubmitRun(kRunYaml, "run.yaml", false).IgnoreError();
  coordinator_->Tick();
  ASSERT_EQ(workers_.prepare_requests.size(), 4u);
  const v1::PrepareRunRequest &t1 = workers_.prepare_requests[2],
                              &d1 = workers_.prepare_requests[3];
  EXPECT_EQ(t1.transport(), "nccl");
  EXPECT_EQ(d1.transport(), "nccl");
  EXPECT_TRUE(t1.channel_descriptor().empty());
  EXPECT_EQ(d1.channel_descriptor(), "channel-" + t1.channel());
}

// Data-parallel placement: auto takes every idle CPU pair, whose drafters share a host group;
// pair 0's drafter alone checkpoints; GPU drafters get the nccl collective with the pair-0
// drafter's unique id, one per GPU (auto stops at a shared GPU; an explicit count that needs one
// fails the run naming the field).
TEST_F(CoordinatorTest, DataParallelPairsFormTheirDrafterGroup) {
  auto worker = [&](const std::string& name, v1::WorkerRole role, const std::string& kind,
                    int index) {
    v1::WorkerInfo w;
    w.set_name(name);
    w.set_role(role);
    w.set_control_address(absl::StrCat("10.0.0.1:", 100 + static_cast<int>(name[1])));
    w.mutable_device()->set_kind(kind);
    w.mutable_device()->set_index(index);
    return coordinator_->Register(w)->worker_id();
  };
  for (const char* n : {"t0", "t1"}) worker(n, v1::WORKER_ROLE_TARGET, "cpu", -1);
  for (const char* n : {"d0", "d1"}) worker(n, v1::WORKER_ROLE_DRAFTER, "cpu", -1);
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_DONE);
  ASSERT_EQ(workers_.prepare_requests.size(), 4u);  // t0, d0, t1, d1
  const v1::PrepareRunRequest &d0 = workers_.prepare_requests[1],
                              &d1 = workers_.prepare_requests[3];
  EXPECT_EQ(d0.num_pairs(), 2);
  EXPECT_EQ(d1.pair(), 1);
  EXPECT_EQ(d0.collective(), "host");
  EXPECT_FALSE(d0.drafter_group().empty());
  EXPECT_EQ(d0.drafter_group(), d1.drafter_group());
  EXPECT_TRUE(workers_.prepare_requests[0].drafter_group().empty()) << "targets join no group";
  int checkpoints = 0;
  for (const v1::RunStepRequest& r : workers_.requests) {
    if (r.checkpoint_path().empty()) continue;
    ++checkpoints;
  }
  EXPECT_EQ(checkpoints, 3) << "steps 2, 4 and the last, by one drafter";

  // GPUs: one drafter per GPU. d0/d1 on GPUs 0 and 1 form an nccl group.
  Reopen(":memory:");
  AddGpuWorker("t0", v1::WORKER_ROLE_TARGET, 0);
  AddGpuWorker("t1", v1::WORKER_ROLE_TARGET, 1);
  AddGpuWorker("d0", v1::WORKER_ROLE_DRAFTER, 0);
  AddGpuWorker("d1", v1::WORKER_ROLE_DRAFTER, 1);
  run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  ASSERT_EQ(workers_.prepare_requests.size(), 8u);
  EXPECT_EQ(workers_.prepare_requests[5].collective(), "nccl");
  EXPECT_EQ(workers_.prepare_requests[5].num_pairs(), 2);
  EXPECT_EQ(workers_.prepare_requests[7].nccl_unique_id(), "id-" + run.run_id());

  // Two drafters on one GPU: auto takes one pair; two pairs asked for fail by name.
  Reopen(":memory:");
  AddGpuWorker("t0", v1::WORKER_ROLE_TARGET, 0);
  AddGpuWorker("t1", v1::WORKER_ROLE_TARGET, 0);
  AddGpuWorker("d0", v1::WORKER_ROLE_DRAFTER, 0);
  AddGpuWorker("d1", v1::WORKER_ROLE_DRAFTER, 0);
  run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  ASSERT_EQ(workers_.prepare_requests.size(), 10u);
  EXPECT_EQ(workers_.prepare_requests[9].num_pairs(), 1);
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_DONE);
  auto two = *coordinator_->SubmitRun(absl::StrCat(kRunYaml, "placement: {pairs: 2}\n"), "run.yaml",
                                      false);
  coordinator_->Tick();
  auto failed = *coordinator_->GetRun(two.run_id());
  EXPECT_EQ(failed.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("share GPU 0; NCCL refuses two ranks on one device"));
}

// The memory plan (common/plan/memory_plan.h): PlanRun reports it against the registered GPUs;
// submit refuses a run that fits no registered drafter GPU, naming the dominant term and a
// setting that fits; a run queued before the GPUs registered fails at placement on a pair whose
// GPU is too small, before anything is prepared.
TEST_F(CoordinatorTest, MemoryPlanIsReportedAndEnforcedAtSubmitAndAtPlacement) {
  constexpr char kBig[] = R"(
name: big
target: {path: "builtin:qwen3-8b-random"}
data: {train: "builtin:long-synthetic", max_length: 2048}
batching: {token_budget: 8192, max_anchors: 512}
optim: {max_steps: 5}
)";
  // Queued while no GPU is registered: nothing to check against yet.
  auto queued = coordinator_->SubmitRun(kBig, "big.yaml", false);
  ASSERT_TRUE(queued.ok()) << queued.status();
  auto gpu = [&](const std::string& name, v1::WorkerRole role, int index, double gib) {
    v1::WorkerInfo w;
    w.set_name(name);
    w.set_role(role);
    w.set_control_address(absl::StrCat("10.0.0.1:", 200 + index));
    w.mutable_device()->set_kind("cuda");
    w.mutable_device()->set_index(index);
    w.mutable_device()->set_total_bytes(static_cast<uint64_t>(gib * (1 << 30)));
    return coordinator_->Register(w)->worker_id();
  };
  gpu("t0", v1::WORKER_ROLE_TARGET, 0, 80);
  gpu("d0", v1::WORKER_ROLE_DRAFTER, 0, 20);  // the drafter needs ~21.3 GiB
  auto plan = coordinator_->PlanRun(kBig);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->table(), HasSubstr("transport cuda_ipc"));
  EXPECT_THAT(plan->table(), HasSubstr("(DOES NOT FIT)"));
  ASSERT_EQ(plan->problems_size(), 1);
  EXPECT_THAT(plan->problems(0), HasSubstr("the drafter worker d0 needs"));
  EXPECT_THAT(plan->json(), HasSubstr("\"allocator_peak_bytes\""));
  // --largest: the largest budget each role's registered GPU takes (the drafter's is below the
  // run's 8192: it does not fit), the same numbers as plan::LargestTokenBudget's.
  auto largest = coordinator_->PlanRun(kBig, /*largest=*/true);
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_THAT(largest->table(), HasSubstr("largest batches that fit (batching.max_anchors scaled "
                                          "with the budget: 512 per 8192 tokens):\n"));
  EXPECT_THAT(largest->table(),
              HasSubstr("  drafter worker d0, 20.00 GiB: batching.token_budget "));
  EXPECT_THAT(largest->table(), HasSubstr("  target worker t0, 80.00 GiB: batching.token_budget "));
  const nlohmann::json lj = nlohmann::json::parse(largest->json())["largest"];
  ASSERT_GE(lj.size(), 2u);
  EXPECT_EQ(lj[1]["who"], "drafter worker d0");
  EXPECT_GT(lj[1]["token_budget"].get<int64_t>(), 0);
  EXPECT_LT(lj[1]["token_budget"].get<int64_t>(), 8192);
  EXPECT_LE(lj[1]["device_bytes"].get<int64_t>(), int64_t{20} << 30);
  EXPECT_FALSE(nlohmann::json::parse(plan->json()).contains("largest"));  // only when asked
  auto refused = coordinator_->SubmitRun(kBig, "big.yaml", false);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("big.yaml: memory plan: the drafter worker d0"));
  EXPECT_THAT(refused.status().message(), HasSubstr("the largest term is activations"));
  EXPECT_THAT(refused.status().message(), HasSubstr("batching.max_anchors 512 -> "));
  // The run queued earlier is placed on that pair and fails there, preparing nothing.
  coordinator_->Tick();
  auto failed = *coordinator_->GetRun(queued->run_id());
  EXPECT_EQ(failed.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("memory plan: the drafter worker d0 (GPU 0) needs"));
  EXPECT_TRUE(workers_.prepare_requests.empty());
}

// Settings echo: a worker that would apply another value than the resolved config (a setting
// that silently did not reach the code) stops the run before its first step, naming the field;
// echoed values equal to the resolved ones (derived ones included) start it.
TEST_F(CoordinatorTest, SettingsEchoThatDiffersFromTheResolvedConfigRefusesTheRun) {
  workers_.echo_overrides = {{"batching.max_anchors", "16"},
                             {"target.layer_ids", "1,2,3,4,5"},
                             {"optim.total_steps", "5"},
                             {"loss.gamma", "7"},
                             {"placement.transport", "host"},
                             {"drafter.mask_token_id", "1"}};  // auto: the built-in target's
  auto ok = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(ok.run_id())->state(), v1::RUN_STATE_DONE)
      << coordinator_->GetRun(ok.run_id())->message();
  // A worker that resolves `auto` to another mask token than the coordinator is refused.
  workers_.echo_overrides["drafter.mask_token_id"] = "7";
  auto other_mask = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  EXPECT_THAT(coordinator_->GetRun(other_mask.run_id())->message(),
              HasSubstr("settings echo: drafter.mask_token_id: worker t0 would apply '7' where "
                        "the run's resolved config says '1'"));
  workers_.echo_overrides["drafter.mask_token_id"] = "1";
  workers_.echo_overrides["batching.max_anchors"] = "8";
  auto bad = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  auto failed = *coordinator_->GetRun(bad.run_id());
  EXPECT_EQ(failed.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(failed.message(),
              HasSubstr("settings echo: batching.max_anchors: worker t0 would apply '8' where "
                        "the run's resolved config says '16'"));
  EXPECT_EQ(failed.step(), 0);
}

// A worker that does not echo a setting it must apply (one that may never have reached its code)
// is refused as one that echoes another value: before the first step, naming field and worker.
TEST_F(CoordinatorTest, SettingsEchoThatOmitsARequiredSettingRefusesTheRun) {
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  for (const auto& [omitted, worker] :
       {std::make_pair("placement.transport", "t0"), std::make_pair("optim.lr", "d0"),
        std::make_pair("drafter.mask_token_id", "d0")}) {
    workers_.echo_omit = {omitted};
    auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
    coordinator_->Tick();
    auto failed = *coordinator_->GetRun(run.run_id());
    EXPECT_EQ(failed.state(), v1::RUN_STATE_FAILED) << omitted;
    EXPECT_THAT(failed.message(),
                HasSubstr(absl::StrCat("settings echo: ", omitted, ": worker ", worker,
                                       " did not report the value it applies")));
    EXPECT_EQ(failed.step(), 0);
  }
  EXPECT_TRUE(workers_.steps.empty());
  workers_.echo_omit.clear();
  // Kernel switches in a worker's environment are recorded in the run's start event.
  workers_.kernel_overrides = "DFLASH_FUSED_ROPE=0";
  auto ok = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(ok.run_id())->state(), v1::RUN_STATE_DONE);
  bool terminal = false;
  auto events =
      coordinator_->WaitForEvents(ok.run_id(), 0, std::chrono::milliseconds(0), &terminal);
  ASSERT_TRUE(events.ok());
  bool recorded = false;
  for (const v1::RunEvent& e : *events) {
    recorded = recorded || absl::StrContains(e.message(),
                                             "t0 applied 5 settings, kernel overrides "
                                             "DFLASH_FUSED_ROPE=0");
  }
  EXPECT_TRUE(recorded);
}

}  // namespace
}  // namespace dflash::coordinator

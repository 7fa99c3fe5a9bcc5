// A drafter trained end to end through the real processes: the coordinator plans the steps, the
// target worker runs the built-in target and sends features over the shared-memory channel, the
// drafter worker trains, checkpoints and exports. A drafter killed mid-run is replaced and the
// run resumes from its checkpoint with the loss curve of an undisturbed run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/builtin_tokenizer.h"
#include "common/metrics/catalogue.h"
#include "common/model/safetensors.h"
#include "tests/common/http_get.h"
#include "tests/integration/training_cluster.h"

namespace dflash::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using ms = std::chrono::milliseconds;

constexpr int64_t kSteps = 24;

TEST_F(TrainingCluster, TrainsExportsAndResumesAKilledDrafterOnTheSameLossCurve) {
  const std::string run_yaml = WriteRunYaml(
      "run.yaml", absl::StrCat("name: e2e\nseed: 3\n"
                               "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                               "drafter: {layers: 1, block_size: 8}\n"
                               "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                               "batching: {token_budget: 512, max_anchors: 64, grad_accum: 2}\n"
                               "optim: {lr: 2.0e-2, max_steps: ",
                               kSteps,
                               "}\n"
                               "placement: {pairs: 1, transport: host}\n"
                               "checkpoint: {every_steps: 6, keep: 2}\n"
                               "eval: {every_steps: 12, prompts: \"builtin:tiny-chat\", "
                               "max_prompts: 3, max_new_tokens: 24}\n"));
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");

  // 1. An undisturbed run, followed by dflashctl as a user would.
  CtlResult follow = RunCtl(address_, {"submit", run_yaml});
  ASSERT_EQ(follow.exit_code, 0) << follow.out << follow.err;
  EXPECT_THAT(follow.out, HasSubstr("starting -> running: training 24 steps from step 0"));
  EXPECT_THAT(follow.out, HasSubstr("running -> done: trained 24 steps"));
  CtlResult list = RunCtl(address_, {"list", "-o", "json"});
  const std::string first = json::parse(list.out)["runs"][0]["run_id"];
  const std::map<int64_t, double> reference = Losses(first);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));
  const std::map<int64_t, double> logged = LoggedLosses(first);  // printed with 4 decimals
  ASSERT_EQ(logged.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, loss] : reference) EXPECT_NEAR(logged.at(step), loss, 1e-4);
  // The loss falls (tiny-chat is learnable: from about ln 512 = 6.2, 24 steps take it to 5.0, the
  // demo's 300 steps below 1).
  EXPECT_LT(reference.at(kSteps - 1), reference.at(0) - 1.0)
      << reference.at(0) << " -> " << reference.at(kSteps - 1);
  json done = Status(first);
  EXPECT_EQ(done["step"], std::to_string(kSteps));  // int64 is a string in proto JSON
  EXPECT_GE(done["last_step"]["acceptance_length"].get<double>(), 1.0);
  EXPECT_EQ(done["last_step"]["slot_accuracy"].size(), 8u);
  // Checkpoints 18 and 24 kept (keep: 2), and the serving-format export.
  const std::string run_dir = done["run_dir"];
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints/step-000000000024.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints/step-000000000018.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(run_dir + "/checkpoints/step-000000000012.safetensors"));
  // The run store, run directory, checkpoints, export and logs are private to the user (the
  // processes' default umask 077): no group or other permission bits anywhere.
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_ + "/state")) {
    const auto perms = entry.status().permissions();
    EXPECT_EQ(perms & (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
              std::filesystem::perms::none)
        << entry.path();
  }
  // Every process's lines about the run, tagged with the run id and step, in the run directory.
  for (const char* log : {"coordinator.log", "target-t0.log", "drafter-d0.log"}) {
    EXPECT_THAT(ReadFile(run_dir + "/logs/" + log), HasSubstr(" run=" + first + " step=")) << log;
  }
  // Every metric of the catalogue is exported, with a sample, by each process of its component
  // (the dashboard and alerts depend on them existing before anything unusual happens).
  const std::map<std::string, int> ports = {
      {"coordinator", metrics_port_},
      {"target", ReadReadyPort(dir_ + "/t0.ready", "metrics_port", ms(1000))},
      {"drafter", ReadReadyPort(dir_ + "/d0.ready", "metrics_port", ms(1000))}};
  std::map<std::string, std::string> scraped;
  for (const auto& [process, port] : ports) scraped[process] = HttpGet(port, "/metrics");
  for (const metrics::MetricDef& def : metrics::Catalogue()) {
    for (const auto& [process, text] : scraped) {
      if ((std::string(def.component) == "coordinator") != (process == "coordinator")) continue;
      const std::string name = def.name;
      EXPECT_TRUE(text.find("\n" + name + "{") != std::string::npos ||
                  text.find("\n" + name + " ") != std::string::npos)
          << process << " exports no sample of " << name;
    }
  }
  // Evaluated by speculative decoding after steps 12 and 24: the target decoded the
  // prompts with the drafter's snapshots.
  ASSERT_TRUE(done.contains("last_eval")) << done.dump();
  EXPECT_EQ(done["last_eval"]["step"], "24");
  const double tau = done["last_eval"]["tau"].get<double>();
  EXPECT_GE(tau, 1.0);
  EXPECT_LE(tau, 8.0);
  EXPECT_EQ(done["last_eval"]["acceptance_by_position"].size(), 8u);
  // The reference package's measures: verifications by tokens emitted (0..B), the two taus.
  EXPECT_EQ(done["last_eval"]["emitted_histogram"].size(), 9u);
  const double pooled = done["last_eval"]["tau_pooled"].get<double>();
  EXPECT_GE(pooled, 1.0);
  EXPECT_LE(pooled, tau);
  EXPECT_EQ(done["last_eval"]["prompts"], "3");
  // The evaluation of step 12's snapshot ran beside the next steps: its tau is committed with the
  // first step that ended after it, not with step 12 (index 11), which did not wait for it. The
  // last evaluation (of the export) is waited for and committed with the last step.
  const std::map<int64_t, json> steps = StepMetrics(first);
  int64_t carried = -1;
  for (int64_t s = 11; s < kSteps - 1 && carried < 0; ++s) {
    if (steps.at(s).value("measuredAcceptanceLength", 0.0) >= 1.0) carried = s;
  }
  EXPECT_GT(carried, 11) << "the step of the snapshot waited for its evaluation";
  EXPECT_DOUBLE_EQ(steps.at(kSteps - 1).value("measuredAcceptanceLength", 0.0), tau);
  EXPECT_THAT(ReadFile(run_dir + "/logs/coordinator.log"),
              HasSubstr("evaluated the drafter of step 24: tau"));
  EXPECT_THAT(ReadFile(run_dir + "/logs/target-t0.log"), HasSubstr("evaluated "));

  CtlResult exported = RunCtl(address_, {"export", first, "--out", dir_ + "/drafter"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  // dflashctl eval on the exported drafter, with the run's target and prompts: the same tau as
  // the run's last evaluation (same weights, prompts and target on the CPU).
  CtlResult eval =
      RunCtl(address_, {"eval", run_yaml, "--drafter", dir_ + "/drafter", "-o", "json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  json measured = json::parse(eval.out);
  EXPECT_DOUBLE_EQ(measured["tau"].get<double>(), tau) << eval.out;
  // fp32 on the CPU: the speculative output equals plain greedy decoding for every prompt.
  EXPECT_GT(measured["baseline_tokens_per_second"].get<double>(), 0.0) << eval.out;
  EXPECT_EQ(measured["baseline_identical_prompts"], measured["prompts"]) << eval.out;
  EXPECT_EQ(measured["worker"], "t0");
  // By context length: tiny-chat's prompts and answers stay under 1024 tokens, so one bucket,
  // holding every verification with the whole run's tau.
  ASSERT_EQ(measured["by_context"].size(), 1u) << eval.out;
  EXPECT_EQ(measured["by_context"][0]["max_tokens"], "1024");
  EXPECT_EQ(measured["by_context"][0]["verifications"], measured["verifications"]);
  EXPECT_DOUBLE_EQ(measured["by_context"][0]["tau"].get<double>(), tau);
  CtlResult table = RunCtl(
      address_, {"eval", "--target", "builtin:tiny-qwen3", "--prompts", "builtin:tiny-chat",
                 "--drafter", dir_ + "/drafter", "--max_prompts", "2", "--max_new_tokens", "8"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("tau "));
  EXPECT_THAT(table.out, HasSubstr("prompts    2, "));
  EXPECT_THAT(table.out, HasSubstr("identical  2 of 2 prompts"));
  EXPECT_THAT(table.out, HasSubstr("context    0-1023 tokens"));
  EXPECT_THAT(table.out, HasSubstr("decoding   greedy"));
  // Sampled speculative decoding (docs/method.md §1.1): the same seed twice gives the same
  // output, so the same acceptance; the decoding is reported; nothing is compared token for
  // token with plain sampling (other draws).
  const std::vector<std::string> sampled = {"eval",
                                            "--target",
                                            "builtin:tiny-qwen3",
                                            "--prompts",
                                            "builtin:tiny-chat",
                                            "--drafter",
                                            dir_ + "/drafter",
                                            "--max_prompts",
                                            "3",
                                            "--max_new_tokens",
                                            "16",
                                            "--temperature",
                                            "0.8",
                                            "--top_k",
                                            "20",
                                            "--seed",
                                            "5",
                                            "-o",
                                            "json"};
  CtlResult s1 = RunCtl(address_, sampled), s2 = RunCtl(address_, sampled);
  ASSERT_EQ(s1.exit_code, 0) << s1.err;
  ASSERT_EQ(s2.exit_code, 0) << s2.err;
  const json j1 = json::parse(s1.out), j2 = json::parse(s2.out);
  EXPECT_DOUBLE_EQ(j1["temperature"].get<double>(), 0.8) << s1.out;
  EXPECT_EQ(j1["top_k"], "20");
  EXPECT_EQ(j1["seed"], "5");
  EXPECT_EQ(j1["verifications"], j2["verifications"]);
  EXPECT_DOUBLE_EQ(j1["tau"].get<double>(), j2["tau"].get<double>());
  EXPECT_FALSE(j1.contains("baseline_identical_prompts") && j1["baseline_identical_prompts"] != "0")
      << s1.out;
  // A temperature below zero never reaches a worker.
  CtlResult negative =
      RunCtl(address_, {"eval", run_yaml, "--drafter", dir_ + "/drafter", "--temperature", "-1"});
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_THAT(negative.err + negative.out, HasSubstr("--temperature"));
  // Chat prompts without answers (rendered with the generation prompt; the built-in target's
  // tokenizer needs data.chat_template chatml named).
  const std::string chat_prompts = dir_ + "/chat-prompts.jsonl";
  std::ofstream(chat_prompts) << R"({"messages":[{"role":"user","content":"hello there"}]})"
                              << "\n"
                              << R"({"messages":[{"role":"system","content":"s"},)"
                              << R"({"role":"user","content":"q"}]})"
                              << "\n";
  const std::string chat_yaml = WriteRunYaml(
      "chat-eval.yaml",
      absl::StrCat("name: chat-eval\ntarget: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                   "drafter: {layers: 1, block_size: 8}\n"
                   "data: {train: \"",
                   chat_prompts, "\", format: chat, chat_template: chatml}\n"));
  CtlResult chat = RunCtl(address_, {"eval", chat_yaml, "--prompts", chat_prompts, "--drafter",
                                     dir_ + "/drafter", "--max_new_tokens", "8"});
  EXPECT_EQ(chat.exit_code, 0) << chat.out << chat.err;
  EXPECT_THAT(chat.out, HasSubstr("prompts    2, "));
  CtlResult nothing = RunCtl(address_, {"eval", run_yaml, "--drafter", dir_ + "/no-such"});
  EXPECT_EQ(nothing.exit_code, 3) << nothing.out << nothing.err;
  EXPECT_THAT(nothing.err, HasSubstr("drafter.init_from"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/drafter/config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/drafter/model.safetensors"));
  EXPECT_EQ(RunCtl(address_, {"export", first, "--out", dir_ + "/drafter"}).exit_code, 1);
  // export --best: the drafter of the run's best held-out tau (the first step reaching the
  // highest of the evaluations in eval/results.jsonl), which eval measures at that same tau.
  int64_t best_step = 0;
  double best_tau = 0;
  std::istringstream results(ReadFile(run_dir + "/eval/results.jsonl"));
  for (std::string line; std::getline(results, line);) {
    const json r = json::parse(line);
    if (r["tau"].get<double>() > best_tau) {
      best_tau = r["tau"].get<double>();
      best_step = std::stoll(r["step"].get<std::string>());
    }
  }
  ASSERT_GT(best_step, 0);
  CtlResult best =
      RunCtl(address_, {"export", first, "--best", "--out", dir_ + "/best", "-o", "json"});
  ASSERT_EQ(best.exit_code, 0) << best.err;
  const json best_json = json::parse(best.out);
  EXPECT_EQ(best_json["step"], best_step) << best.out;
  EXPECT_DOUBLE_EQ(best_json["tau"].get<double>(), best_tau) << best.out;
  CtlResult best_eval =
      RunCtl(address_, {"eval", run_yaml, "--drafter", dir_ + "/best", "-o", "json"});
  ASSERT_EQ(best_eval.exit_code, 0) << best_eval.err;
  EXPECT_DOUBLE_EQ(json::parse(best_eval.out)["tau"].get<double>(), best_tau) << best_eval.out;
  EXPECT_EQ(Status(first)["best_eval"]["step"], std::to_string(best_step));
  EXPECT_THAT(RunCtl(address_, {"status", first}).out,
              HasSubstr(absl::StrCat("best eval: step ", best_step, ": tau ")));
  CtlResult best_text = RunCtl(address_, {"export", first, "--best", "--out", dir_ + "/best2"});
  EXPECT_THAT(best_text.out,
              HasSubstr(absl::StrCat("(step ", best_step, ", the run's best held-out tau ")));

  // 2. The same run again; its drafter is killed after step 8 and comes back.
  const std::string second = Submit(run_yaml);
  ASSERT_TRUE(WaitFor([&] { return Losses(second).size() >= 9; }, ms(60000)));
  workers_["d0"]->Signal(SIGKILL);
  workers_["d0"]->Wait();
  ASSERT_TRUE(WaitFor([&] { return Status(second)["state"] == "RUN_STATE_QUEUED"; }, ms(10000)))
      << Status(second).dump();
  StartWorker("drafter", "d0");
  ASSERT_TRUE(WaitFor([&] { return Status(second)["state"] == "RUN_STATE_DONE"; }, ms(60000)))
      << Status(second).dump() << ReadFile(dir_ + "/coordinator.log");
  EXPECT_THAT(ReadFile(dir_ + "/coordinator.log"), HasSubstr("resuming at step "));
  const std::map<int64_t, double> resumed = Losses(second);
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, loss] : reference) {
    EXPECT_EQ(resumed.at(step), loss) << "step " << step;  // bit-identical on the CPU
  }
}

// Data parallel on the CPU: with two idle pairs, placement auto takes both; the two drafters sum
// their gradients through the host communicator, and the run's losses equal, bit for bit, those
// of one pair accumulating the same two micro-batches per step (grad_accum 2).
TEST_F(TrainingCluster, TwoDataParallelPairsEqualOnePairAccumulatingTwiceAndSurviveAKill) {
  const auto yaml = [](const char* name, const char* placement, int grad_accum,
                       const char* recompute = "none") {
    return absl::StrCat("name: ", name,
                        "\nseed: 5\n"
                        "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                        "drafter: {layers: 1, block_size: 8, recompute: ",
                        recompute,
                        "}\n"
                        "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                        "batching: {token_budget: 512, max_anchors: 64, grad_accum: ",
                        grad_accum,
                        "}\n"
                        "optim: {lr: 2.0e-2, max_steps: 16}\n"
                        "placement: {",
                        placement,
                        "transport: host}\n"
                        "checkpoint: {every_steps: 4, keep: 1}\n");
  };
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  StartWorker("target", "t1");
  StartWorker("drafter", "d1");
  CtlResult one =
      RunCtl(address_, {"submit", WriteRunYaml("one.yaml", yaml("one", "pairs: 1, ", 2))});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_THAT(one.out, HasSubstr("placed on 1 pair(s)"));
  CtlResult two = RunCtl(address_, {"submit", WriteRunYaml("two.yaml", yaml("two", "", 1))});
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_THAT(two.out, HasSubstr("placed on 2 pair(s)"));
  EXPECT_THAT(two.out, HasSubstr("running -> done: trained 16 steps"));
  json runs = json::parse(RunCtl(address_, {"list", "-o", "json"}).out)["runs"];
  ASSERT_EQ(runs.size(), 2u);
  std::map<std::string, std::string> ids;
  for (const json& r : runs) ids[r["name"]] = r["run_id"];
  const std::map<int64_t, double> want = Losses(ids["one"]), got = Losses(ids["two"]);
  ASSERT_EQ(want.size(), 16u);
  ASSERT_EQ(got.size(), 16u);
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;
  // Both pairs held the run (their logs in the run directory); pair 0's drafter checkpointed.
  const std::string run_dir = Status(ids["two"])["run_dir"];
  EXPECT_THAT(ReadFile(run_dir + "/logs/drafter-d0.log"), HasSubstr("(peer w1-"));
  for (const char* log : {"drafter-d0.log", "drafter-d1.log", "target-t0.log", "target-t1.log"}) {
    EXPECT_THAT(ReadFile(run_dir + "/logs/" + log), HasSubstr("prepared (peer ")) << log;
  }
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints/step-000000000016.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/export/model.safetensors"));
  // drafter.recompute: layers through the workers (parsed, applied, echoed): the same curve, to
  // fp32 rounding in general (each recomputed layer sums its inputs' gradients first; with this
  // one-layer drafter the sums happen in the same order and the curve is equal bit for bit).
  const std::string recomputed =
      Submit(WriteRunYaml("layers.yaml", yaml("layers", "", 1, "layers")));
  ASSERT_TRUE(WaitFor([&] { return Status(recomputed)["state"] == "RUN_STATE_DONE"; }, ms(60000)))
      << Status(recomputed).dump();
  const std::map<int64_t, double> relaid = Losses(recomputed);
  ASSERT_EQ(relaid.size(), 16u);
  double largest = 0;
  for (const auto& [step, loss] : got) {
    EXPECT_NEAR(relaid.at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
    largest = std::max(largest, std::abs(relaid.at(step) - loss) / std::abs(loss));
  }
  std::printf("recompute layers against none: largest relative loss difference %.3g\n", largest);
  const std::string layers_dir = Status(recomputed)["run_dir"];
  EXPECT_THAT(ReadFile(layers_dir + "/logs/drafter-d0.log"), HasSubstr("recompute layers"));
  EXPECT_THAT(ReadFile(run_dir + "/logs/drafter-d0.log"), HasSubstr("recompute none"));

  // The two-pair run again; drafter d1 is killed after step 5: d0, blocked in the gradient sum,
  // is released (its communicator aborted), the run pauses, waits for two pairs again (auto keeps
  // the pair count of its data cursor), resumes from its newest checkpoint on the same curve.
  const std::string again = Submit(WriteRunYaml("again.yaml", yaml("again", "", 1)));
  ASSERT_TRUE(WaitFor([&] { return Losses(again).size() >= 6; }, ms(60000)));
  workers_["d1"]->Signal(SIGKILL);
  workers_["d1"]->Wait();
  ASSERT_TRUE(WaitFor([&] { return Status(again)["state"] == "RUN_STATE_QUEUED"; }, ms(10000)))
      << Status(again).dump();
  StartWorker("drafter", "d1");
  ASSERT_TRUE(WaitFor([&] { return Status(again)["state"] == "RUN_STATE_DONE"; }, ms(60000)))
      << Status(again).dump() << ReadFile(dir_ + "/coordinator.log");
  EXPECT_THAT(ReadFile(dir_ + "/coordinator.log"), HasSubstr("resuming at step "));
  const std::map<int64_t, double> resumed = Losses(again);
  ASSERT_EQ(resumed.size(), 16u);
  for (const auto& [step, loss] : got) EXPECT_EQ(resumed.at(step), loss) << "step " << step;
}

// Out of memory, through the real processes: a drafter whose micro-batches above 300
// tokens fail as out of memory (the test hook) trains them as halves by document, and a target
// whose forwards above 300 tokens fail runs them in halves; each run ends with the same tokens
// per step and the loss curve of the run without the hook, and says so.
TEST_F(TrainingCluster, OutOfMemoryMicroBatchesAreSplitAndTheRunKeepsItsLossCurve) {
  const auto yaml = [&](const char* name) {
    return WriteRunYaml(
        absl::StrCat(name, ".yaml"),
        absl::StrCat("name: ", name,
                     "\nseed: 4\n"
                     "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                     "drafter: {layers: 1, block_size: 8}\n"
                     "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                     "batching: {token_budget: 512, max_anchors: 64, grad_accum: 2}\n"
                     "optim: {lr: 2.0e-2, max_steps: 8}\n"
                     "placement: {pairs: 1, transport: host}\n"));
  };
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const std::string plain = Submit(yaml("plain"));
  ASSERT_TRUE(
      WaitFor([&] { return Status(plain).value("state", "") == "RUN_STATE_DONE"; }, ms(120000)))
      << Status(plain).dump();
  workers_.erase("d0");  // the same drafter again, with the hook
  setenv("DFLASH_TEST_OOM_ABOVE_TOKENS", "300", 1);
  StartWorker("drafter", "d1", /*gpu=*/-1, /*test_hooks=*/true);
  unsetenv("DFLASH_TEST_OOM_ABOVE_TOKENS");
  const std::string split = Submit(yaml("split"));
  ASSERT_TRUE(
      WaitFor([&] { return Status(split).value("state", "") == "RUN_STATE_DONE"; }, ms(120000)))
      << Status(split).dump();
  const std::map<int64_t, json> a = StepMetrics(plain), b = StepMetrics(split);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  int64_t splits = 0;
  for (const auto& [step, m] : a) {
    const json& n = b.at(step);
    EXPECT_EQ(n.value("tokens", std::string()), m.value("tokens", std::string())) << step;
    // Each micro-batch's weight is an fp32 sum: the halves round differently in the last bits.
    EXPECT_NEAR(n.value("weightSum", 0.0), m.value("weightSum", 0.0),
                1e-6 * m.value("weightSum", 1.0))
        << step;
    EXPECT_NEAR(n.value("loss", 0.0), m.value("loss", 0.0), 1e-4 * m.value("loss", 1.0)) << step;
    splits += std::stoll(n.value("oomSplits", std::string("0")));
  }
  EXPECT_GT(splits, 0) << "no micro-batch was above 300 tokens";
  EXPECT_THAT(ReadFile(dir_ + "/state/runs/" + split + "/logs/coordinator.log"),
              HasSubstr("out of memory: "));
  // The same hook on the target: its forward runs the documents in halves into the same rows.
  workers_.erase("t0");
  workers_.erase("d1");
  setenv("DFLASH_TEST_OOM_ABOVE_TOKENS", "300", 1);
  StartWorker("target", "t1", /*gpu=*/-1, /*test_hooks=*/true);
  unsetenv("DFLASH_TEST_OOM_ABOVE_TOKENS");
  StartWorker("drafter", "d2");
  const std::string halves = Submit(yaml("halves"));
  ASSERT_TRUE(
      WaitFor([&] { return Status(halves).value("state", "") == "RUN_STATE_DONE"; }, ms(120000)))
      << Status(halves).dump();
  const std::map<int64_t, json> c = StepMetrics(halves);
  ASSERT_EQ(c.size(), 8u);
  splits = 0;
  for (const auto& [step, m] : a) {
    const json& n = c.at(step);
    EXPECT_EQ(n.value("tokens", std::string()), m.value("tokens", std::string())) << step;
    EXPECT_NEAR(n.value("loss", 0.0), m.value("loss", 0.0), 1e-4 * m.value("loss", 1.0)) << step;
    splits += std::stoll(n.value("oomSplits", std::string("0")));
  }
  EXPECT_GT(splits, 0);
}

// A tiny Qwen3.5 vision-language checkpoint (text backbone under model.language_model., no
// vision tower: dflash never reads it) with random weights: 4 layers, three gated delta-rule
// layers then gated full attention, the vocabulary and tokenizer of builtin:tiny-qwen3.
void WriteTinyQwen35(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << data::TinyQwen3TokenizerJson();
  std::ofstream(dir + "/config.json") << R"({"model_type": "qwen3_5",
    "architectures": ["Qwen3_5ForConditionalGeneration"], "tie_word_embeddings": false,
    "text_config": {"model_type": "qwen3_5_text", "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.25}}})";
  std::mt19937 rng(11);
  std::vector<std::vector<float>> data;
  std::vector<model::TensorToWrite> tensors;
  // Matrices N(0, 1/in); vectors filled with `fill` (zero-centered norms: 0 is a scale of 1).
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float fill, bool random) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> normal(0.f, 1.f / std::sqrt(static_cast<float>(shape.back())));
    std::vector<float> v(static_cast<size_t>(n), fill);
    if (random) {
      for (float& x : v) x = normal(rng);
    }
    data.push_back(std::move(v));
    tensors.push_back(
        {name, model::DType::kF32, shape, data.back().data(), data.back().size() * sizeof(float)});
  };
  data.reserve(64);
  const std::string p = "model.language_model.";
  add(p + "embed_tokens.weight", {512, 64}, 0, true);
  add(p + "norm.weight", {64}, 0, false);
  add("lm_head.weight", {512, 64}, 0, true);
  for (int i = 0; i < 4; ++i) {
    const std::string l = absl::StrCat(p, "layers.", i, ".");
    add(l + "input_layernorm.weight", {64}, 0, false);
    add(l + "post_attention_layernorm.weight", {64}, 0, false);
    if (i < 3) {
      add(l + "linear_attn.in_proj_qkv.weight", {128, 64}, 0, true);
      add(l + "linear_attn.in_proj_z.weight", {64, 64}, 0, true);
      add(l + "linear_attn.in_proj_b.weight", {4, 64}, 0, true);
      add(l + "linear_attn.in_proj_a.weight", {4, 64}, 0, true);
      add(l + "linear_attn.conv1d.weight", {128, 1, 4}, 0, true);
      add(l + "linear_attn.dt_bias", {4}, 1, false);
      add(l + "linear_attn.A_log", {4}, -1, false);
      add(l + "linear_attn.norm.weight", {16}, 1, false);
      add(l + "linear_attn.out_proj.weight", {64, 64}, 0, true);
    } else {
      add(l + "self_attn.q_proj.weight", {256, 64}, 0, true);
      add(l + "self_attn.k_proj.weight", {64, 64}, 0, true);
      add(l + "self_attn.v_proj.weight", {64, 64}, 0, true);
      add(l + "self_attn.o_proj.weight", {64, 128}, 0, true);
      add(l + "self_attn.q_norm.weight", {32}, 0, false);
      add(l + "self_attn.k_norm.weight", {32}, 0, false);
    }
    add(l + "mlp.gate_proj.weight", {128, 64}, 0, true);
    add(l + "mlp.up_proj.weight", {128, 64}, 0, true);
    add(l + "mlp.down_proj.weight", {64, 128}, 0, true);
  }
  ASSERT_TRUE(model::WriteSafetensors(dir + "/model.safetensors", tensors, {}).ok());
}

// A hybrid linear-attention target loaded from a checkpoint directory by the target
// worker, its features trained on by the drafter worker, the loss falling.
TEST_F(TrainingCluster, AHybridTargetFromACheckpointTrainsADrafter) {
  const std::string target = dir_ + "/qwen3_5";
  WriteTinyQwen35(target);
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const std::string run = Submit(WriteRunYaml(
      "hybrid.yaml", absl::StrCat("name: hybrid\nseed: 5\n"
                                  "target: {path: \"",
                                  target,
                                  "\", dtype: float32, layer_ids: [0, 1, 2, 3]}\n"
                                  "drafter: {layers: 1, block_size: 8, mask_token_id: 1}\n"
                                  "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                                  "batching: {token_budget: 512, max_anchors: 64}\n"
                                  "optim: {lr: 2.0e-2, max_steps: 16}\n"
                                  "placement: {pairs: 1, transport: host}\n")));
  WaitFor(
      [&] {
        const std::string state = Status(run).value("state", "");
        return state == "RUN_STATE_DONE" || state == "RUN_STATE_FAILED";
      },
      ms(120000));
  ASSERT_EQ(Status(run).value("state", ""), "RUN_STATE_DONE")
      << Status(run).dump() << ReadFile(dir_ + "/t0.log");
  const std::map<int64_t, double> losses = Losses(run);
  ASSERT_EQ(losses.size(), 16u);
  double first = 0, last = 0;
  int64_t i = 0;
  for (const auto& [step, loss] : losses) {
    if (i < 4) first += loss / 4;
    if (i >= 12) last += loss / 4;
    ++i;
  }
  std::printf("hybrid target: mean loss of the first 4 steps %.4f, of the last 4 %.4f\n", first,
              last);
  EXPECT_LT(last, 0.95 * first);
}

// loss.weighting: dpace through the workers: the drafter applies and echoes it (the run starts
// only when the echo equals the resolved config: 17 settings), and the drafter learns under it.
TEST_F(TrainingCluster, ADpaceWeightedRunIsEchoedAndLearns) {
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const std::string yaml = WriteRunYaml("dpace.yaml",
                                        "name: dpace\nseed: 3\n"
                                        "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                                        "drafter: {layers: 1, block_size: 8}\n"
                                        "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                                        "batching: {token_budget: 512, max_anchors: 64}\n"
                                        "optim: {lr: 2.0e-2, max_steps: 16}\n"
                                        "loss: {weighting: dpace, dpace_alpha: 0.25}\n"
                                        "placement: {pairs: 1, transport: host}\n");
  CtlResult follow = RunCtl(address_, {"submit", yaml});
  ASSERT_EQ(follow.exit_code, 0) << follow.out << follow.err;
  // The kernel reports: a CPU target and drafter run the reference attention, and say so.
  EXPECT_THAT(follow.out, HasSubstr("t0 applied 5 settings, attention: reference (the CPU)"));
  EXPECT_THAT(follow.out, HasSubstr("d0 applied 26 settings, attention: reference in every layer "
                                    "(the drafter is on the CPU)"));
  EXPECT_THAT(follow.out, HasSubstr("running -> done: trained 16 steps"));
  const std::string run =
      json::parse(RunCtl(address_, {"list", "-o", "json"}).out)["runs"][0]["run_id"];
  EXPECT_THAT(Status(run)["resolved_config_yaml"].get<std::string>(),
              HasSubstr("weighting: dpace"));
  const std::map<int64_t, double> losses = Losses(run);
  ASSERT_EQ(losses.size(), 16u);
  double first = 0, last = 0;
  for (int64_t i = 0; i < 4; ++i) first += losses.at(i) / 4, last += losses.at(12 + i) / 4;
  std::printf("dpace: mean loss of the first 4 steps %.4f, of the last 4 %.4f\n", first, last);
  EXPECT_LT(last, first - 0.3);  // 5.64 -> 5.15 when written (deterministic on the CPU)
}

// drafter.sliding_layers through the workers: the drafter builds and echoes them (17 settings,
// the run starts only when they equal the resolved config), trains, and the export writes them as
// the serving format has them (layer_types, sliding_window with use_sliding_window).
// drafter.kind: dflash2 (docs/method.md §2.2) through the processes: the drafter echoes its
// DFlash2 settings, trains (convolutions and the selector's loss), the export is a
// DFlash2DraftModel that `dflashctl eval` decodes with its selector; the selector loss's warm-up
// and ramp are echoed. A DFlash2 setting (the schedule included) with
// drafter.kind dflash, and a selector top-k above the target's vocabulary, are refused at submit
// naming the field.
TEST_F(TrainingCluster, ADflash2RunTrainsExportsAndIsEvaluated) {
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  auto yaml = [](const std::string& name, const std::string& drafter,
                 const std::string& loss = "") {
    return absl::StrCat("name: ", name,
                        "\nseed: 3\n"
                        "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                        "drafter: {layers: 1, block_size: 8",
                        drafter, "}\n", loss,
                        "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                        "batching: {token_budget: 512, max_anchors: 64}\n"
                        "optim: {lr: 2.0e-2, max_steps: 10}\n"
                        "placement: {pairs: 1, transport: host}\n"
                        "eval: {prompts: \"builtin:tiny-chat\", max_prompts: 3, "
                        "max_new_tokens: 16}\n");
  };
  CtlResult wrong =
      RunCtl(address_, {"submit", WriteRunYaml("wrong.yaml", yaml("wrong", ", selector_rank: 8"))});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_THAT(wrong.err, HasSubstr("drafter.selector_rank: taken by drafter.kind dflash2 only"));
  CtlResult wide =
      RunCtl(address_, {"submit", WriteRunYaml("wide.yaml", yaml("wide",
                                                                 ", kind: dflash2, "
                                                                 "selector_top_k: 100000"))});
  EXPECT_NE(wide.exit_code, 0);
  EXPECT_THAT(wide.err, HasSubstr("drafter.selector_top_k: 100000 is above the target's "
                                  "vocabulary of 512 tokens"));
  CtlResult early =
      RunCtl(address_, {"submit", WriteRunYaml("early.yaml", yaml("early", "",
                                                                  "loss: {selector_ramp_steps: "
                                                                  "3}\n"))});
  EXPECT_NE(early.exit_code, 0);
  EXPECT_THAT(early.err, HasSubstr("loss.selector_ramp_steps: taken by drafter.kind dflash2 only"));

  const std::string two =
      WriteRunYaml("two.yaml", yaml("two",
                                    ", kind: dflash2, conv_group_size: 8, selector_rank: 16, "
                                    "selector_top_k: 8",
                                    "loss: {selector_warmup_steps: 2, selector_ramp_steps: 3}\n"));
  CtlResult follow = RunCtl(address_, {"submit", two});
  ASSERT_EQ(follow.exit_code, 0) << follow.out << follow.err;
  EXPECT_THAT(follow.out, HasSubstr("d0 applied 26 settings"));
  const json runs = json::parse(RunCtl(address_, {"list", "-o", "json"}).out)["runs"];
  ASSERT_EQ(runs.size(), 1u) << "a refused run was stored";
  const std::string run = runs[0]["run_id"];
  const std::map<int64_t, double> losses = Losses(run);
  ASSERT_EQ(losses.size(), 10u);
  // The reported loss holds the selector's term from the ramp on (steps 2-4 rising, full from 5).
  EXPECT_LT(losses.at(9), losses.at(5)) << losses.at(0) << " " << losses.at(5);
  CtlResult exported = RunCtl(address_, {"export", run, "--out", dir_ + "/export2"});
  ASSERT_EQ(exported.exit_code, 0) << exported.out << exported.err;
  const json config = json::parse(ReadFile(dir_ + "/export2/config.json"));
  EXPECT_EQ(config["architectures"], json({"DFlash2DraftModel"}));
  EXPECT_EQ(config["dflash_config"]["conv_kernel_size"], 2);
  EXPECT_EQ(config["dflash_config"]["selector_top_k"], 8);
  CtlResult eval = RunCtl(address_, {"eval", two, "--drafter", dir_ + "/export2", "-o", "json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const json measured = json::parse(eval.out);
  EXPECT_GE(measured["tau"].get<double>(), 1.0) << eval.out;
  // fp32 on the CPU: the selector's drafts are verified, the output is plain greedy decoding's.
  EXPECT_EQ(measured["baseline_identical_prompts"], measured["prompts"]) << eval.out;
}

// drafter.precision: fp8 (docs/method.md §4.1) needs a drafter on a GPU of compute capability 8.9
// or later: with only a CPU drafter registered, submit refuses it naming the field and the worker,
// and stores nothing.
TEST_F(TrainingCluster, Fp8OnACpuDrafterIsRefusedAtSubmit) {
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const std::string yaml = WriteRunYaml("fp8.yaml",
                                        "name: fp8\n"
                                        "target: {path: \"builtin:tiny-qwen3\", dtype: bfloat16}\n"
                                        "drafter: {layers: 1, block_size: 8, precision: fp8}\n"
                                        "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                                        "batching: {token_budget: 512, max_anchors: 64}\n"
                                        "optim: {max_steps: 2}\n"
                                        "placement: {pairs: 1, transport: host}\n");
  CtlResult refused = RunCtl(address_, {"submit", yaml});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("drafter.precision: fp8 needs a drafter on a GPU of compute "
                                     "capability 8.9 or later; the registered drafters are d0 "
                                     "(cpu)"));
  const json runs = json::parse(RunCtl(address_, {"list", "-o", "json"}).out)["runs"];
  EXPECT_TRUE(runs.empty()) << runs.dump();
}

TEST_F(TrainingCluster, ASlidingLayerRunIsEchoedTrainsAndExportsItsLayerTypes) {
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const std::string yaml =
      WriteRunYaml("sliding.yaml",
                   "name: sliding\nseed: 3\n"
                   "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                   "drafter: {layers: 2, block_size: 8, sliding_layers: [1], sliding_window: 24}\n"
                   "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                   "batching: {token_budget: 512, max_anchors: 64}\n"
                   "optim: {lr: 2.0e-2, max_steps: 8}\n"
                   "placement: {pairs: 1, transport: host}\n");
  CtlResult follow = RunCtl(address_, {"submit", yaml});
  ASSERT_EQ(follow.exit_code, 0) << follow.out << follow.err;
  EXPECT_THAT(follow.out, HasSubstr("d0 applied 26 settings"));
  const std::string run =
      json::parse(RunCtl(address_, {"list", "-o", "json"}).out)["runs"][0]["run_id"];
  const std::map<int64_t, double> losses = Losses(run);
  ASSERT_EQ(losses.size(), 8u);
  EXPECT_LT(losses.at(7), losses.at(0));
  CtlResult exported = RunCtl(address_, {"export", run, "--out", dir_ + "/export"});
  ASSERT_EQ(exported.exit_code, 0) << exported.out << exported.err;
  const json config = json::parse(ReadFile(dir_ + "/export/config.json"));
  EXPECT_EQ(config["layer_types"], json({"full_attention", "sliding_attention"}));
  EXPECT_EQ(config["sliding_window"], 24);
  EXPECT_EQ(config["use_sliding_window"], true);

  // A drafter of that form as drafter.init_from (as a published drafter's config writes it,
  // transformers' "dtype" key and max_window_layers included): sliding_layers: auto takes its
  // layers and window, and training starts from its weights.
  json published = config;
  published["dtype"] = published["torch_dtype"];
  published.erase("torch_dtype");
  published["max_window_layers"] = 2;
  std::ofstream(dir_ + "/export/config.json") << published.dump(2);
  const std::string from = WriteRunYaml(
      "from.yaml", absl::StrCat("name: from\nseed: 4\n"
                                "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                                "drafter: {layers: 2, block_size: 8, init_from: \"",
                                dir_,
                                "/export\"}\n"
                                "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                                "batching: {token_budget: 512, max_anchors: 64}\n"
                                "optim: {lr: 2.0e-2, max_steps: 2}\n"
                                "placement: {pairs: 1, transport: host}\n"));
  CtlResult adopted = RunCtl(address_, {"submit", from});
  ASSERT_EQ(adopted.exit_code, 0) << adopted.out << adopted.err;
  EXPECT_THAT(adopted.out, HasSubstr("d0 applied 26 settings"));
  std::string run2;
  const json listed = json::parse(RunCtl(address_, {"list", "-o", "json"}).out);
  for (const json& r : listed["runs"]) {
    const std::string id = r.value("run_id", "");
    if (id.rfind("from-", 0) == 0) run2 = id;  // run ids start with the run's name
  }
  const std::map<int64_t, double> resumed = Losses(run2);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_LT(resumed.at(0), losses.at(0));  // the trained weights, not a fresh drafter
  // The same drafter with its sliding layer left out is refused by name, before any step.
  std::string none = ReadFile(from);
  none.replace(none.find("init_from"), 0, "sliding_layers: [], ");
  CtlResult refused = RunCtl(address_, {"submit", WriteRunYaml("none.yaml", none)});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.out + refused.err, HasSubstr("layer_types"));
}

}  // namespace
}  // namespace dflash::testing

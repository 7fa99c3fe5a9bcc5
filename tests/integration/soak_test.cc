// Soak test of fault tolerance: a run of a few hundred steps during which a harness
// SIGKILLs a random worker three times and the coordinator once, each restarted at once as
// systemd or compose would. At the end the committed steps, the tokens trained and the loss curve
// equal, bit for bit, those of an undisturbed run with the same seed: every step committed
// exactly once, a step in flight at a crash redone from the last checkpoint, never counted twice.
//
// A killed worker is restarted either at once (racing the coordinator's detection: a failed call,
// the heartbeat timeout or the new incarnation's registration, whichever comes first) or only
// after the coordinator has paused the run and queued it again, as a slow restart would be.
//
// DFLASH_SOAK_STEPS (default 300) and DFLASH_SOAK_SEED (default 1; the kill schedule's seed) make
// the longer runs of scripts/soak.sh.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/training_cluster.h"

namespace dflash::testing {
namespace {

using ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::stoll(v) : fallback;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST_F(TrainingCluster, ThreeWorkerKillsAndACoordinatorCrashLeaveTheLossCurveUnchanged) {
  const int64_t steps = EnvInt("DFLASH_SOAK_STEPS", 300);
  const uint64_t seed = static_cast<uint64_t>(EnvInt("DFLASH_SOAK_SEED", 1));
  ASSERT_GE(steps, 40);
  const std::string run_yaml = WriteRunYaml(
      "run.yaml", absl::StrCat("name: soak\nseed: 11\n"
                               "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                               "drafter: {layers: 1, block_size: 8}\n"
                               "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                               "batching: {token_budget: 512, max_anchors: 32}\n"
                               "optim: {lr: 1.0e-2, max_steps: ",
                               steps,
                               "}\n"
                               "placement: {pairs: 1, transport: host}\n"
                               "checkpoint: {every_steps: 10, keep: 2}\n"));
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const ms run_timeout(std::max<int64_t>(120000, steps * 1500));

  // The undisturbed run.
  const auto t_ref = Clock::now();
  const std::string reference_id = Submit(run_yaml);
  ASSERT_TRUE(
      WaitFor([&] { return Status(reference_id)["state"] == "RUN_STATE_DONE"; }, run_timeout))
      << Status(reference_id).dump();
  const double reference_s = Seconds(Clock::now() - t_ref);
  const std::map<int64_t, nlohmann::json> reference = StepMetrics(reference_id);
  ASSERT_EQ(reference.size(), static_cast<size_t>(steps));

  // The kill schedule: four distinct steps in [10, steps - 10), one of them the coordinator's.
  std::mt19937_64 rng(seed);
  std::set<int64_t> at;
  while (at.size() < 4) {
    at.insert(std::uniform_int_distribution<int64_t>(10, steps - 11)(rng));
  }
  const size_t coordinator_kill = std::uniform_int_distribution<size_t>(0, 3)(rng);
  std::vector<std::string> victims;
  std::vector<bool> restart_late;
  for (size_t k = 0; k < 4; ++k) {
    victims.push_back(k == coordinator_kill                   ? "coordinator"
                      : std::bernoulli_distribution(0.5)(rng) ? "t0"
                                                              : "d0");
    restart_late.push_back(std::bernoulli_distribution(0.5)(rng));
  }

  const auto t_run = Clock::now();
  const std::string run_id = Submit(run_yaml);
  ASSERT_FALSE(run_id.empty());
  const std::string run_log = dir_ + "/state/runs/" + run_id + "/logs/coordinator.log";
  auto resumes = [&] {
    const std::string log = ReadFile(run_log);
    size_t n = 0;
    for (size_t pos = 0; (pos = log.find("resuming at step ", pos)) != std::string::npos; ++pos) {
      ++n;
    }
    return n;
  };
  size_t k = 0;
  std::vector<double> recovery_s;
  for (int64_t step : at) {
    ASSERT_TRUE(WaitFor([&] { return StepMetrics(run_id).size() > static_cast<size_t>(step); },
                        run_timeout))
        << "waiting for step " << step << ": " << Status(run_id).dump();
    const size_t resumed_before = resumes();
    const std::string& victim = victims[k];
    const bool late = victim != "coordinator" && restart_late[k];
    ++k;
    const auto t_kill = Clock::now();
    size_t committed = 0;  // at the kill: read once the process is gone
    if (victim == "coordinator") {
      coordinator_->Signal(SIGKILL);
      coordinator_->Wait();
      committed = StepMetrics(run_id).size();
      StartCoordinator(address_);
    } else {
      workers_[victim]->Signal(SIGKILL);
      workers_[victim]->Wait();
      committed = StepMetrics(run_id).size();
      if (late) {  // a failed call or the heartbeat timeout (1 s here) pauses the run
        ASSERT_TRUE(
            WaitFor([&] { return Status(run_id)["state"] == "RUN_STATE_QUEUED"; }, ms(10000)))
            << Status(run_id).dump();
      }
      StartWorker(victim == "t0" ? "target" : "drafter", victim);
    }
    std::cerr << "[soak] step " << committed << ": SIGKILLed " << victim
              << (late ? ", restarted after the run paused" : ", restarted at once") << "\n";
    // Recovered once the run has resumed from a checkpoint and committed a step beyond those
    // committed at the kill. (A step the target had already computed may still commit after
    // the kill, before the loss is noticed: only a resumption proves the kill was handled.)
    ASSERT_TRUE(WaitFor(
        [&] { return resumes() > resumed_before && StepMetrics(run_id).size() > committed; },
        run_timeout))
        << Status(run_id).dump() << ReadFile(dir_ + "/coordinator.log");
    recovery_s.push_back(Seconds(Clock::now() - t_kill));
  }
  ASSERT_TRUE(WaitFor([&] { return Status(run_id)["state"] == "RUN_STATE_DONE"; }, run_timeout))
      << Status(run_id).dump() << ReadFile(dir_ + "/coordinator.log");
  const double disturbed_s = Seconds(Clock::now() - t_run);

  // Every step committed once, with the undisturbed run's tokens and loss, bit for bit.
  const std::map<int64_t, nlohmann::json> disturbed = StepMetrics(run_id);
  ASSERT_EQ(disturbed.size(), static_cast<size_t>(steps));
  int64_t tokens_ref = 0, tokens = 0;
  for (const auto& [step, m] : reference) {
    const nlohmann::json& d = disturbed.at(step);
    EXPECT_EQ(d.value("loss", 0.0), m.value("loss", 0.0)) << "step " << step;
    EXPECT_EQ(d.value("tokens", "0"), m.value("tokens", "0")) << "step " << step;
    tokens_ref += std::stoll(m.value("tokens", "0"));
    tokens += std::stoll(d.value("tokens", "0"));
  }
  EXPECT_EQ(tokens, tokens_ref);
  EXPECT_EQ(Status(run_id)["step"], std::to_string(steps));
  // Four pauses, four resumptions from a checkpoint.
  EXPECT_EQ(resumes(), 4u) << ReadFile(run_log);

  std::cerr << "[soak] " << steps << " steps, " << tokens << " tokens; undisturbed " << reference_s
            << " s, disturbed " << disturbed_s << " s; recovery (kill to the next "
            << "new step):";
  for (size_t i = 0; i < recovery_s.size(); ++i) {
    std::cerr << " " << victims[i] << " " << recovery_s[i] << " s";
  }
  std::cerr << "\n";
}

// A worker that hangs (SIGSTOP: alive, its sockets open, silent) is a stuck peer: marked down at
// the heartbeat timeout, its calls abandoned, the run paused and queued again; a fresh worker
// under the same name resumes it from the checkpoint with the undisturbed loss curve.
TEST_F(TrainingCluster, AHungWorkerIsMarkedDownAndTheRunResumesWithoutIt) {
  const std::string run_yaml =
      WriteRunYaml("run.yaml",
                   "name: hang\nseed: 4\n"
                   "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                   "drafter: {layers: 1, block_size: 8}\n"
                   "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                   "batching: {token_budget: 512, max_anchors: 32}\n"
                   "optim: {lr: 1.0e-2, max_steps: 40}\n"
                   "placement: {pairs: 1, transport: host}\n"
                   "checkpoint: {every_steps: 10, keep: 2}\n");
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const std::string reference_id = Submit(run_yaml);
  ASSERT_TRUE(
      WaitFor([&] { return Status(reference_id)["state"] == "RUN_STATE_DONE"; }, ms(120000)));
  const std::map<int64_t, nlohmann::json> reference = StepMetrics(reference_id);

  for (const std::string victim : {"d0", "t0"}) {
    SCOPED_TRACE(victim);
    const std::string run_id = Submit(run_yaml);
    ASSERT_TRUE(WaitFor([&] { return StepMetrics(run_id).size() >= 15; }, ms(120000)));
    workers_[victim]->Signal(SIGSTOP);
    const auto t_stop = Clock::now();
    // Paused and queued again within the heartbeat timeout (1 s) plus the sweep and polling.
    ASSERT_TRUE(WaitFor([&] { return Status(run_id)["state"] == "RUN_STATE_QUEUED"; }, ms(5000)))
        << Status(run_id).dump() << ReadFile(dir_ + "/coordinator.log");
    const double detected_s = Seconds(Clock::now() - t_stop);
    workers_[victim]->Signal(SIGKILL);  // what systemd's watchdog or an operator does next
    workers_[victim]->Wait();
    StartWorker(victim == "t0" ? "target" : "drafter", victim);
    ASSERT_TRUE(WaitFor([&] { return Status(run_id)["state"] == "RUN_STATE_DONE"; }, ms(120000)))
        << Status(run_id).dump() << ReadFile(dir_ + "/coordinator.log");
    const std::map<int64_t, nlohmann::json> resumed = StepMetrics(run_id);
    ASSERT_EQ(resumed.size(), reference.size());
    for (const auto& [step, m] : reference) {
      EXPECT_EQ(resumed.at(step).value("loss", 0.0), m.value("loss", 0.0)) << "step " << step;
    }
    std::cerr << "[soak] hung " << victim << " detected in " << detected_s << " s\n";
  }
}

}  // namespace
}  // namespace dflash::testing

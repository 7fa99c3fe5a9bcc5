// The real coordinator, a target worker and a drafter worker on OS-chosen loopback ports, driven
// through dflashctl as a user would.
#include "tests/integration/cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "tests/common/http_get.h"

namespace dflash::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using ms = std::chrono::milliseconds;

constexpr int kHeartbeatMs = 100;
constexpr int kTimeoutMs = 1000;
// How late the coordinator may notice a dead worker: its sweep runs every heartbeat/4.
constexpr int kSweepMs = kHeartbeatMs / 4;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    if (!HasFailure())
      std::filesystem::remove_all(dir_);
    else
      std::cerr << "logs kept in " << dir_ << "\n";
  }

  // Starts the coordinator; listen = "127.0.0.1:0" picks a port, or pass one to restart on it.
  // `extra`: more flags.
  void StartCoordinator(const std::string& listen = "127.0.0.1:0",
                        const std::vector<std::string>& extra = {}) {
    const std::string ready = dir_ + "/coordinator.ready";
    std::filesystem::remove(ready);
    std::vector<std::string> args = {"--listen",
                                     listen,
                                     "--metrics_listen",
                                     "127.0.0.1:0",
                                     "--state_dir",
                                     dir_ + "/state",
                                     "--heartbeat_interval_ms",
                                     std::to_string(kHeartbeatMs),
                                     "--worker_timeout_ms",
                                     std::to_string(kTimeoutMs),
                                     "--ready_file",
                                     ready};
    args.insert(args.end(), extra.begin(), extra.end());
    coordinator_ = std::make_unique<Process>(BinDir() + "/coordinator/dflash-coordinator", args,
                                             dir_ + "/coordinator.log");
    port_ = ReadReadyPort(ready, "grpc_port", ms(20000));
    ASSERT_GT(port_, 0) << ReadFile(dir_ + "/coordinator.log");
    metrics_port_ = ReadReadyPort(ready, "metrics_port", ms(1000));
    address_ = "127.0.0.1:" + std::to_string(port_);
  }

  Process* StartWorker(const std::string& role, const std::string& name) {
    const std::string ready = dir_ + "/" + name + ".ready";
    workers_.push_back(std::make_unique<Process>(
        BinDir() + "/" + role + "_worker/dflash-" + role + "-worker",
        std::vector<std::string>{"--coordinator", address_, "--name", name, "--ready_file", ready},
        dir_ + "/" + name + ".log"));
    EXPECT_GT(ReadReadyPort(ready, "grpc_port", ms(30000)), 0)
        << ReadFile(dir_ + "/" + name + ".log");
    return workers_.back().get();
  }

  json Workers() {
    CtlResult r = RunCtl(address_, {"workers", "--output", "json"});
    if (r.exit_code != 0) return json::object();
    return json::parse(r.out).value("workers", json::array());
  }

  std::string Health(const std::string& name) {
    for (const auto& w : Workers()) {
      if (w["name"] == name) return w["health"];
    }
    return "";
  }

  std::string dir_, address_;
  int port_ = 0, metrics_port_ = 0;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
};

TEST_F(ClusterTest, WorkersRegisterAndAKilledWorkerIsMarkedDownWithinTheTimeout) {
  StartCoordinator();
  Process* target = StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  ASSERT_TRUE(WaitFor([&] { return Workers().size() == 2; }, ms(10000)));
  json workers = Workers();
  EXPECT_EQ(workers[0]["name"], "t0");
  EXPECT_EQ(workers[0]["role"], "WORKER_ROLE_TARGET");
  EXPECT_EQ(workers[1]["name"], "d0");
  EXPECT_EQ(workers[1]["role"], "WORKER_ROLE_DRAFTER");
  for (const auto& w : workers) {
    EXPECT_EQ(w["health"], "WORKER_HEALTH_UP");
    EXPECT_EQ(w["device"]["kind"], "cpu");
  }
  // Both roles serve /metrics and the coordinator counts their heartbeats.
  ASSERT_TRUE(WaitFor(
      [&] {
        return HttpGet(metrics_port_, "/metrics").find("dflash_coordinator_heartbeats_total") !=
               std::string::npos;
      },
      ms(5000)));

  target->Signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  target->Wait();
  ASSERT_TRUE(WaitFor([&] { return Health("t0") == "WORKER_HEALTH_DOWN"; }, ms(3 * kTimeoutMs)));
  const auto elapsed = std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - killed_at);
  // Down no earlier than the timeout minus one heartbeat, no later than timeout + sweep + slack
  // for the dflashctl poll (each poll is a process start, ~50 ms here).
  EXPECT_GE(elapsed.count(), kTimeoutMs - kHeartbeatMs);
  EXPECT_LE(elapsed.count(), kTimeoutMs + kSweepMs + 400)
      << "noticed after " << elapsed.count() << " ms";
  EXPECT_EQ(Health("d0"), "WORKER_HEALTH_UP");
}

TEST_F(ClusterTest, SubmittedRunSurvivesACoordinatorRestartAndWorkersRegisterAgain) {
  StartCoordinator();
  const std::string run_yaml = dir_ + "/run.yaml";
  std::ofstream(run_yaml)
      << "name: restart-test\n"
         "target: {path: \"builtin:tiny-qwen3\"}\n"
         "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
         "batching: {token_budget: 1024}\n"
         "placement: {pairs: 2}\n";  // never placeable with one pair: stays queued
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  CtlResult submit = RunCtl(address_, {"--output", "json", "submit", run_yaml, "--detach"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string run_id = json::parse(submit.out)["run_id"];
  ASSERT_FALSE(run_id.empty());

  coordinator_->Signal(SIGTERM);
  EXPECT_EQ(coordinator_->Wait(), 0);                  // clean shutdown
  EXPECT_EQ(RunCtl(address_, {"list"}).exit_code, 4);  // unreachable while down
  StartCoordinator("127.0.0.1:" + std::to_string(port_));

  CtlResult list = RunCtl(address_, {"list", "--output", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  json runs = json::parse(list.out)["runs"];
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0]["run_id"], run_id);
  EXPECT_EQ(runs[0]["state"], "RUN_STATE_QUEUED");
  EXPECT_THAT(runs[0]["resolved_config_yaml"].get<std::string>(), HasSubstr("pairs: 2"));
  // Workers learn from a NOT_FOUND heartbeat that the coordinator forgot them, and register again.
  ASSERT_TRUE(WaitFor([&] { return Workers().size() == 2; }, ms(10000)));
  CtlResult status = RunCtl(address_, {"status", run_id});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_THAT(status.out, HasSubstr("state:    queued"));
}

TEST_F(ClusterTest, DemoRunTrainsAndARunningRunCanBeCancelled) {
  StartCoordinator();
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  ASSERT_TRUE(WaitFor([&] { return Workers().size() == 2; }, ms(10000)));
  CtlResult submit = RunCtl(
      address_, {"-o", "json", "submit", DFLASH_SOURCE_DIR "/configs/demo.yaml", "--detach"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string run_id = json::parse(submit.out)["run_id"];
  auto status = [&] {
    CtlResult r = RunCtl(address_, {"status", run_id, "-o", "json"});
    return r.exit_code == 0 ? json::parse(r.out) : json::object();
  };
  // Steps are committed while it runs; then a cancel stops it and frees the pair.
  ASSERT_TRUE(WaitFor([&] { return status().value("step", "0") != "0"; }, ms(60000)))
      << status().dump() << ReadFile(dir_ + "/coordinator.log");
  EXPECT_EQ(status()["state"], "RUN_STATE_RUNNING");
  ASSERT_EQ(RunCtl(address_, {"cancel", run_id}).exit_code, 0);
  EXPECT_EQ(status()["state"], "RUN_STATE_CANCELLED");
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const auto& w : Workers()) {
          if (w.value("run_id", "") != "") return false;
        }
        return true;
      },
      ms(10000)));
  EXPECT_THAT(ReadFile(dir_ + "/coordinator.log"), HasSubstr(" run=demo-"));
  // Released by the coordinator's ReleaseRun, or dropped at the next heartbeat, whichever is
  // first. The registry frees the workers at the cancel, before either reaches the worker: wait
  // for the worker's own line.
  auto released = [&] {
    const std::string d0 = ReadFile(dir_ + "/d0.log");
    return d0.find("released") != std::string::npos ||
           d0.find("no longer assigns this run") != std::string::npos;
  };
  EXPECT_TRUE(WaitFor(released, ms(10000))) << ReadFile(dir_ + "/d0.log");
}

TEST_F(ClusterTest, WorkersShutDownCleanlyOnSigterm) {
  StartCoordinator();
  Process* target = StartWorker("target", "t0");
  Process* drafter = StartWorker("drafter", "d0");
  ASSERT_TRUE(WaitFor([&] { return Workers().size() == 2; }, ms(10000)));
  target->Signal(SIGTERM);
  drafter->Signal(SIGTERM);
  EXPECT_EQ(target->Wait(), 0);
  EXPECT_EQ(drafter->Wait(), 0);
  EXPECT_THAT(ReadFile(dir_ + "/t0.log"), HasSubstr("signal 15: shutting down"));
  EXPECT_THAT(ReadFile(dir_ + "/t0.log"), HasSubstr("stopped"));
}

TEST_F(ClusterTest, CancelAQueuedRunThroughDflashctl) {
  StartCoordinator();
  CtlResult submit = RunCtl(
      address_, {"-o", "json", "submit", DFLASH_SOURCE_DIR "/configs/demo.yaml", "--detach"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string run_id = json::parse(submit.out)["run_id"];
  CtlResult cancel = RunCtl(address_, {"cancel", run_id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  CtlResult status = RunCtl(address_, {"status", run_id, "-o", "json"});
  EXPECT_EQ(json::parse(status.out)["state"], "RUN_STATE_CANCELLED");
  EXPECT_EQ(RunCtl(address_, {"cancel", run_id}).exit_code, 1);  // already ended
}

TEST_F(ClusterTest, DflashctlExitCodes) {
  StartCoordinator();
  EXPECT_EQ(RunCtl(address_, {"frobnicate"}).exit_code, 2);
  EXPECT_EQ(RunCtl(address_, {"submit"}).exit_code, 2);  // missing run_yaml
  EXPECT_EQ(RunCtl(address_, {"submit", "--help"}).exit_code, 0);
  const std::string bad = dir_ + "/bad.yaml";
  std::ofstream(bad)
      << "name: x\ntarget: {path: /does/not/exist}\ndata: {train: builtin:tiny-chat}\n"
         "batching: {token_budget: 0}\n";
  CtlResult r = RunCtl(address_, {"submit", bad});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("target.path: path does not exist: /does/not/exist"));
  EXPECT_THAT(r.err, HasSubstr("batching.token_budget: must be >= 256, got 0"));
  EXPECT_EQ(RunCtl("127.0.0.1:1", {"list"}).exit_code, 4);
  EXPECT_EQ(RunCtl(address_, {"status", "no-such-run"}).exit_code, 1);
  CtlResult plan = RunCtl(address_, {"plan", DFLASH_SOURCE_DIR "/configs/demo.yaml"});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("memory plan: 1024 tokens"));
  EXPECT_THAT(plan.out, HasSubstr("(no registered GPU of this role: not checked)"));
}

// A coordinator started with --auth_token_file answers dflashctl only with that bearer token;
// a token file readable by others is refused at start.
TEST_F(ClusterTest, BearerTokenIsRequiredWhenConfigured) {
  const std::string token = dir_ + "/token", wrong = dir_ + "/wrong", open = dir_ + "/open";
  for (const auto& [path, text] :
       {std::make_pair(token, "s3cret-token\n"), std::make_pair(wrong, "not-it\n"),
        std::make_pair(open, "s3cret-token\n")}) {
    std::ofstream(path) << text;
    std::filesystem::permissions(
        path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  std::filesystem::permissions(open, std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  Process refused(
      BinDir() + "/coordinator/dflash-coordinator",
      {"--listen", "127.0.0.1:0", "--state_dir", dir_ + "/state0", "--auth_token_file", open},
      dir_ + "/refused.log");
  EXPECT_NE(refused.Wait(), 0);
  EXPECT_THAT(ReadFile(dir_ + "/refused.log"), HasSubstr("readable by others; chmod 600"));
  StartCoordinator("127.0.0.1:0", {"--auth_token_file", token});
  CtlResult none = RunCtl(address_, {"list"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.err, HasSubstr("requires a bearer token"));
  CtlResult bad = RunCtl(address_, {"list", "--token_file", wrong});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("not this coordinator's"));
  CtlResult good = RunCtl(address_, {"list", "--token_file", token});
  EXPECT_EQ(good.exit_code, 0) << good.err;
  // Workers register through the registry service, which the token does not cover.
  StartWorker("target", "t0");
}

}  // namespace
}  // namespace dflash::testing

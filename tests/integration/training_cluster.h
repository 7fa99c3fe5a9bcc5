// A coordinator and workers as real processes, for the training integration tests.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/integration/cluster.h"

namespace dflash::testing {

// The coordinator on loopback with its state in a fresh directory, workers started on demand, and
// the run store read back for per-step losses.
class TrainingCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    StartCoordinator("127.0.0.1:0");
  }

  // The coordinator on `listen` (port 0: chosen by the OS), its state in the test's directory.
  void StartCoordinator(const std::string& listen) {
    const std::string ready = dir_ + "/coordinator.ready";
    std::filesystem::remove(ready);
    coordinator_ = std::make_unique<Process>(
        BinDir() + "/coordinator/dflash-coordinator",
        std::vector<std::string>{"--listen", listen, "--metrics_listen", "127.0.0.1:0",
                                 "--state_dir", dir_ + "/state", "--heartbeat_interval_ms", "100",
                                 "--worker_timeout_ms", "1000", "--ready_file", ready},
        dir_ + "/coordinator.log");
    const int port = ReadReadyPort(ready, "grpc_port", std::chrono::milliseconds(20000));
    ASSERT_GT(port, 0) << ReadFile(dir_ + "/coordinator.log");
    address_ = "127.0.0.1:" + std::to_string(port);
    metrics_port_ = ReadReadyPort(ready, "metrics_port", std::chrono::milliseconds(1000));
  }

  // A run.yaml in the test's directory.
  std::string WriteRunYaml(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    if (!HasFailure()) {
      std::filesystem::remove_all(dir_);
    } else {
      std::cerr << "logs kept in " << dir_ << "\n";
    }
  }

  // test_hooks: start the -testhooks executable, which reads the DFLASH_TEST_* hooks from the
  // environment (services/worker_common/test_hooks.h); the product executable injects nothing.
  // `extra`: more flags for the worker (e.g. --profile_steps).
  Process* StartWorker(const std::string& role, const std::string& name, int gpu = -1,
                       bool test_hooks = false, const std::vector<std::string>& extra = {}) {
    const std::string ready = dir_ + "/" + name + ".ready";
    std::filesystem::remove(ready);
    std::vector<std::string> args = {"--coordinator", address_, "--name", name,
                                     "--ready_file",  ready,    "--gpu",  std::to_string(gpu)};
    args.insert(args.end(), extra.begin(), extra.end());
    workers_[name] = std::make_unique<Process>(BinDir() + "/" + role + "_worker/dflash-" + role +
                                                   "-worker" + (test_hooks ? "-testhooks" : ""),
                                               args, dir_ + "/" + name + ".log");
    EXPECT_GT(ReadReadyPort(ready, "grpc_port", std::chrono::milliseconds(30000)), 0)
        << ReadFile(dir_ + "/" + name + ".log");
    return workers_[name].get();
  }

  nlohmann::json Status(const std::string& run_id) {
    CtlResult r = RunCtl(address_, {"status", run_id, "-o", "json"});
    return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  }

  std::string Submit(const std::string& run_yaml) {
    CtlResult r = RunCtl(address_, {"-o", "json", "submit", run_yaml, "--detach"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["run_id"].get<std::string>() : "";
  }

  // step -> loss of every step the coordinator logged for the run, from the run directory's
  // coordinator.log ("... run=ID step=N run_driver.cc:L] loss X ..."); a redone step's later line
  // wins.
  std::map<int64_t, double> LoggedLosses(const std::string& run_id) {
    std::map<int64_t, double> out;
    std::istringstream in(ReadFile(dir_ + "/state/runs/" + run_id + "/logs/coordinator.log"));
    const std::string tag = " run=" + run_id + " step=";
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find(tag), loss = line.find("] loss ");
      if (at == std::string::npos || loss == std::string::npos) continue;
      out[std::stoll(line.substr(at + tag.size()))] = std::stod(line.substr(loss + 7));
    }
    return out;
  }

  // step -> loss of every committed step, from the coordinator's run store.
  std::map<int64_t, double> Losses(const std::string& run_id) {
    std::map<int64_t, double> out;
    for (const auto& [step, m] : StepMetrics(run_id)) out[step] = m.value("loss", 0.0);
    return out;
  }

  // step -> the committed step's metrics (StepMetrics as proto JSON: camelCase, int64 as strings,
  // zero values left out), from the coordinator's run store.
  std::map<int64_t, nlohmann::json> StepMetrics(const std::string& run_id) {
    std::map<int64_t, nlohmann::json> out;
    sqlite3* db = nullptr;
    const std::string path = dir_ + "/state/runs.sqlite";
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return out;
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db, "SELECT step, metrics FROM run_steps WHERE run_id = ?1", -1, &st,
                       nullptr);
    sqlite3_bind_text(st, 1, run_id.c_str(), -1, SQLITE_TRANSIENT);
    while (sqlite3_step(st) == SQLITE_ROW) {
      nlohmann::json m =
          nlohmann::json::parse(reinterpret_cast<const char*>(sqlite3_column_text(st, 1)));
      out[sqlite3_column_int64(st, 0)] = std::move(m);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
  }

  std::string dir_, address_;
  int metrics_port_ = 0;  // the coordinator's /metrics
  std::unique_ptr<Process> coordinator_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
};

}  // namespace dflash::testing

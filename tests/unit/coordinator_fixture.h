// The coordinator test fixture: a coordinator over an in-memory run store, a fake clock and fake
// workers (no threads, no sockets, no sleeps), and the run.yaml the tests submit. Shared by
// coordinator_test.cc (submission, placement, evaluation, settings) and
// coordinator_faults_test.cc (lost and failing workers, out of memory, restarts, the event log).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "services/coordinator/coordinator.h"
#include "tests/unit/fake_worker_control.h"

namespace dflash::coordinator {

inline constexpr char kRunYaml[] = R"(
name: unit
target: {path: "builtin:tiny-qwen3"}
data: {train: "builtin:tiny-chat", max_length: 256}
batching: {token_budget: 1024, max_anchors: 16, grad_accum: 2}
optim: {max_steps: 5}
checkpoint: {every_steps: 2, keep: 2}
)";

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dflash-coord-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    state_dir_ = tmpl;
    Reopen(":memory:");
  }
  void TearDown() override {
    coordinator_.reset();
    std::filesystem::remove_all(state_dir_);
  }

  void Reopen(const std::string& path) {
    coordinator_.reset();
    auto store = RunStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions opts;
    opts.heartbeat_interval_ms = 100;
    opts.worker_timeout_ms = 1000;
    opts.state_dir = state_dir_;
    opts.inline_steps = true;  // a placed run trains to its end inside Tick()
    auto c = Coordinator::Create(opts, *std::move(store), &clock_, &workers_, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
  }

  std::string AddWorker(const std::string& name, v1::WorkerRole role) {
    v1::WorkerInfo w;
    w.set_name(name);
    w.set_role(role);
    w.set_control_address("127.0.0.1:1");
    return coordinator_->Register(w)->worker_id();
  }

  // A worker on GPU `index` of host 10.0.0.1 (control port 100 + index); with free_bytes > 0 it
  // reports an 80 GiB GPU with that much free.
  std::string AddGpuWorker(const std::string& name, v1::WorkerRole role, int index,
                           uint64_t free_bytes = 0) {
    v1::WorkerInfo w;
    w.set_name(name);
    w.set_role(role);
    w.set_control_address(absl::StrCat("10.0.0.1:", 100 + index));
    w.mutable_device()->set_kind("cuda");
    w.mutable_device()->set_index(index);
    if (free_bytes > 0) {
      w.mutable_device()->set_total_bytes(uint64_t{80} << 30);
      w.mutable_device()->set_free_bytes(free_bytes);
    }
    return coordinator_->Register(w)->worker_id();
  }

  // The run's status once it shows an evaluation in progress (polled for at most 30 s; the last
  // status read otherwise).
  v1::RunStatus WaitUntilEvaluating(const std::string& run_id) {
    v1::RunStatus seen;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      seen = *coordinator_->GetRun(run_id);
      if (seen.has_evaluating()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return seen;
  }

  void Beat(const std::string& id) {
    v1::HeartbeatRequest req;
    req.set_worker_id(id);
    ASSERT_TRUE(coordinator_->Heartbeat(req).ok());
  }

  std::vector<v1::RunState> History(const std::string& run_id) {
    bool terminal;
    auto events = coordinator_->WaitForEvents(run_id, 0, std::chrono::milliseconds(0), &terminal);
    std::vector<v1::RunState> states;
    for (const auto& e : *events) states.push_back(e.to_state());
    return states;
  }

  std::string state_dir_;
  FakeClock clock_;
  FakeWorkerControl workers_;
  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace dflash::coordinator

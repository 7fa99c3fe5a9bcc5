// The coordinator when things go wrong, with a fake clock and fake workers: workers lost, silent,
// refusing or out of memory, a coordinator restart, cancel and the event log.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "services/coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace dflash::coordinator {
namespace {

using ::testing::HasSubstr;

TEST_F(CoordinatorTest, DrafterThatTrainedOnOtherFeaturesFailsTheRun) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  workers_.drafter_checksum_offset = 1;
  coordinator_->Tick();
  auto after = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(after.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(after.message(), HasSubstr("trained on other features than its target sent"));
  EXPECT_EQ(after.step(), 0);  // nothing committed
}

TEST_F(CoordinatorTest, WorkerLostMidStepPausesThenRequeuesTheRun) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  workers_.on_step = [&](const v1::WorkerInfo& w, const v1::RunStepRequest& req) {
    if (req.step() == 3 && w.worker_id() == d) {
      workers_.step_errors[d] = absl::UnavailableError("connection reset");
    }
  };
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->step(), 3);  // steps 0..2 committed
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_PAUSED);
  coordinator_->Tick();  // the step thread has ended: the run waits for workers again
  // d0 was marked down when the step found it gone, so the run is not offered to it again.
  EXPECT_THAT(
      History(run.run_id()),
      ::testing::ElementsAre(v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING, v1::RUN_STATE_RUNNING,
                             v1::RUN_STATE_PAUSED, v1::RUN_STATE_QUEUED));
  // d0 comes back: the run resumes (no checkpoint here: from step 0, the committed steps are
  // retried with the same cursors and accepted once) and finishes.
  workers_.step_errors.clear();
  workers_.on_step = nullptr;
  Beat(d);
  coordinator_->Tick();
  auto after = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(after.state(), v1::RUN_STATE_DONE) << after.message();
  EXPECT_EQ(after.step(), 5);
}

// An out-of-memory that splitting could not fix pauses the run (it resumes from its checkpoint
// once placed again); the same at the same step after resuming fails it, naming the settings to
// change. A single document that does not fit fails at once: a retry cannot help.
TEST_F(CoordinatorTest, OutOfMemoryPausesTheRunOnceThenFailsItNamingTheSettings) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  const absl::Status oom = absl::ResourceExhaustedError(
      "drafter optimizer step: CUDA out of memory. Tried to allocate 2.00 GiB");
  workers_.on_step = [&](const v1::WorkerInfo& w, const v1::RunStepRequest& req) {
    if (w.worker_id() != d) return;
    if (req.step() == 3) {
      workers_.step_errors[d] = oom;
    } else {
      workers_.step_errors.erase(d);
    }
  };
  coordinator_->Tick();
  auto paused = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(paused.state(), v1::RUN_STATE_PAUSED);
  EXPECT_EQ(paused.step(), 3);  // steps 0..2 committed
  EXPECT_THAT(paused.message(), HasSubstr("CUDA out of memory"));
  EXPECT_THAT(paused.message(), HasSubstr("paused: resumes from its newest checkpoint"));
  // Requeued and placed again (the workers stayed up): step 3 runs out of memory again.
  coordinator_->Tick();
  coordinator_->Tick();
  auto failed = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(failed.state(), v1::RUN_STATE_FAILED) << failed.message();
  EXPECT_THAT(failed.message(), HasSubstr("out of memory again at step 3 after resuming: lower "
                                          "batching.token_budget or batching.max_anchors"));
  // A document that cannot fit on its own: failed at once.
  workers_.step_errors.clear();
  workers_.on_step = [&](const v1::WorkerInfo& w, const v1::RunStepRequest& req) {
    if (req.step() == 1 && w.worker_id() == d) {
      workers_.step_errors[d] = absl::ResourceExhaustedError(
          "drafter backward: CUDA out of memory; not recoverable: the micro-batch is one "
          "document of 2000 tokens (lower data.max_length or batching.token_budget)");
    }
  };
  auto single = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  auto one = *coordinator_->GetRun(single.run_id());
  EXPECT_EQ(one.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(one.message(), HasSubstr("lower data.max_length or batching.token_budget"));
}

// Out of memory while preparing (loading the target, building the drafter): queued again once
// (another process may have taken the memory since the placement's check), failed the second
// time with the settings to change.
TEST_F(CoordinatorTest, OutOfMemoryWhilePreparingRequeuesOnceThenFails) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  workers_.prepare_errors[d] =
      absl::ResourceExhaustedError("drafter: CUDA out of memory. Tried to allocate 20.00 GiB");
  coordinator_->Tick();
  auto queued = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(queued.state(), v1::RUN_STATE_QUEUED);
  EXPECT_THAT(History(run.run_id()),
              ::testing::ElementsAre(v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING,
                                     v1::RUN_STATE_PAUSED, v1::RUN_STATE_QUEUED));
  coordinator_->Tick();
  auto failed = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(failed.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("preparing the run failed: "));
  EXPECT_THAT(failed.message(), HasSubstr("out of memory again after waiting for room: lower "
                                          "batching.token_budget"));
  EXPECT_TRUE(workers_.steps.empty());
}

TEST_F(CoordinatorTest, WorkerRefusingTheConfigFailsTheRunWithItsReason) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  workers_.prepare_errors[d] = absl::InvalidArgumentError("data.train: path does not exist: /x");
  coordinator_->Tick();
  auto after = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(after.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(after.message(), HasSubstr("data.train: path does not exist: /x"));
}

TEST_F(CoordinatorTest, UnreachableWorkerRequeuesTheRunInsteadOfFailingIt) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  std::string t0 = AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d0 = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  workers_.prepare_errors[t0] = absl::UnavailableError("connection refused");
  coordinator_->Tick();
  auto after = *coordinator_->GetRun(run.run_id());
  EXPECT_EQ(after.state(), v1::RUN_STATE_QUEUED);
  EXPECT_THAT(History(run.run_id()),
              ::testing::ElementsAre(v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING,
                                     v1::RUN_STATE_PAUSED, v1::RUN_STATE_QUEUED));
  // t0 was marked down at once: the next ticks do not offer it the run again and again.
  EXPECT_EQ(coordinator_->ListWorkers()[0].health(), v1::WORKER_HEALTH_DOWN);
  const size_t prepares = workers_.prepared.size();
  coordinator_->Tick();
  coordinator_->Tick();
  EXPECT_EQ(workers_.prepared.size(), prepares);
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_QUEUED);
  // A new target arrives; the run goes to t1 + d0.
  clock_.AdvanceMs(1001);
  Beat(d0);
  std::string t1 = AddWorker("t1", v1::WORKER_ROLE_TARGET);
  coordinator_->Tick();
  EXPECT_EQ(workers_.prepared.back(), d0 + ":" + run.run_id());
  EXPECT_THAT(workers_.prepared, ::testing::Contains(t1 + ":" + run.run_id()));
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_DONE);
}

TEST_F(CoordinatorTest, SilentWorkerIsMarkedDownAfterTheTimeoutAndBlocksPlacement) {
  std::string t = AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  clock_.AdvanceMs(999);
  Beat(d);
  clock_.AdvanceMs(1);
  // Placement would happen now if both were idle and up; take the run out of the way first.
  ASSERT_TRUE(coordinator_->CancelRun(run.run_id()).ok());
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->ListWorkers()[0].health(), v1::WORKER_HEALTH_UP);  // 1000 ms: not yet
  clock_.AdvanceMs(1);
  coordinator_->Tick();
  auto workers = coordinator_->ListWorkers();
  EXPECT_EQ(workers[0].health(), v1::WORKER_HEALTH_DOWN);  // silent 1001 ms > 1000 ms
  EXPECT_EQ(workers[1].health(), v1::WORKER_HEALTH_UP);
  // With the only target down, a new run cannot be placed and stays queued.
  auto next = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(next.run_id())->state(), v1::RUN_STATE_QUEUED);
  EXPECT_TRUE(workers_.prepared.empty());
  // The target comes back: the run is placed.
  Beat(t);
  Beat(d);
  coordinator_->Tick();
  EXPECT_EQ(workers_.prepared.size(), 2u);
}

TEST_F(CoordinatorTest, WorkerLostWhileStartingPausesTheRun) {
  std::string t = AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  // While the coordinator waits on the drafter's PrepareRun, the target falls silent.
  workers_.on_prepare = [&](const v1::WorkerInfo& w) {
    if (w.worker_id() != d) return;
    clock_.AdvanceMs(1500);
    Beat(d);
    coordinator_->Tick();
  };
  coordinator_->Tick();
  // Paused, then queued again at once (to resume when a pair is idle); t0 is down, so it waits.
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_QUEUED);
  bool terminal;
  auto events =
      *coordinator_->WaitForEvents(run.run_id(), 0, std::chrono::milliseconds(0), &terminal);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].to_state(), v1::RUN_STATE_PAUSED);
  EXPECT_THAT(events[2].message(), HasSubstr("target worker " + t + " (t0) missed heartbeats"));
  EXPECT_EQ(events[3].to_state(), v1::RUN_STATE_QUEUED);
  for (const auto& w : coordinator_->ListWorkers()) EXPECT_EQ(w.run_id(), "");
}

// A worker that registers again under its name while its run starts was restarted: its new
// process holds no run, so the run is paused at once (not at the next failed call or the
// heartbeat timeout) and the calls in flight to the old process are cancelled.
TEST_F(CoordinatorTest, AWorkerRegisteringAgainMidRunPausesTheRun) {
  std::string t = AddWorker("t0", v1::WORKER_ROLE_TARGET);
  std::string d = AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  workers_.on_prepare = [&](const v1::WorkerInfo& w) {
    if (w.worker_id() != d) return;
    EXPECT_EQ(AddWorker("t0", v1::WORKER_ROLE_TARGET), t);  // same name, same id
  };
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_PAUSED);
  bool terminal;
  auto events =
      *coordinator_->WaitForEvents(run.run_id(), 0, std::chrono::milliseconds(0), &terminal);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2].to_state(), v1::RUN_STATE_PAUSED);
  EXPECT_THAT(events[2].message(), HasSubstr("target worker " + t + " (t0) restarted"));
  EXPECT_THAT(workers_.cancelled, ::testing::Contains(t));
  // The next tick queues it again and places it on the restarted worker: it trains to its end.
  workers_.on_prepare = nullptr;
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetRun(run.run_id())->state(), v1::RUN_STATE_DONE);
}

TEST_F(CoordinatorTest, CancelIsFinalAndRecorded) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  auto cancelled = coordinator_->CancelRun(run.run_id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(coordinator_->CancelRun(run.run_id()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->CancelRun("nope").status().code(), absl::StatusCode::kNotFound);
  AddWorker("t0", v1::WORKER_ROLE_TARGET);
  AddWorker("d0", v1::WORKER_ROLE_DRAFTER);
  coordinator_->Tick();
  EXPECT_TRUE(workers_.prepared.empty());  // a cancelled run is never placed
}

TEST_F(CoordinatorTest, WaitForEventsReturnsHistoryAndReportsTerminal) {
  auto run = *coordinator_->SubmitRun(kRunYaml, "run.yaml", false);
  bool terminal = true;
  auto events =
      coordinator_->WaitForEvents(run.run_id(), 0, std::chrono::milliseconds(0), &terminal);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 1u);
  EXPECT_FALSE(terminal);
  coordinator_->CancelRun(run.run_id()).IgnoreError();
  events = coordinator_->WaitForEvents(run.run_id(), 1, std::chrono::milliseconds(0), &terminal);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].to_state(), v1::RUN_STATE_CANCELLED);
  EXPECT_TRUE(terminal);
  EXPECT_EQ(coordinator_->WaitForEvents("nope", 0, std::chrono::milliseconds(0), &terminal)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, HeartbeatFromUnknownWorkerAsksItToRegisterAgain) {
  v1::HeartbeatRequest req;
  req.set_worker_id("w42");
  EXPECT_EQ(coordinator_->Heartbeat(req).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, RestartPausesInterruptedRunsAndKeepsQueuedOnes) {
  char tmpl[] = "/tmp/dflash-coord-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/runs.sqlite";
  Reopen(path);
  auto queued = *coordinator_->SubmitRun(kRunYaml, "a.yaml", false);
  auto interrupted = *coordinator_->SubmitRun(kRunYaml, "b.yaml", false);
  {
    // Put the second run into `starting` directly in the store, as a crash mid-start leaves it.
    auto store = *RunStore::Open(path);
    ASSERT_TRUE(store
                    ->Transition(interrupted.run_id(), v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING,
                                 "placed", 5)
                    .ok());
  }
  Reopen(path);
  EXPECT_EQ(coordinator_->GetRun(queued.run_id())->state(), v1::RUN_STATE_QUEUED);
  auto paused = *coordinator_->GetRun(interrupted.run_id());
  EXPECT_EQ(paused.state(), v1::RUN_STATE_PAUSED);
  EXPECT_THAT(paused.message(), HasSubstr("coordinator restarted while the run was starting"));
  EXPECT_TRUE(coordinator_->ListWorkers().empty());  // registrations are not persisted
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace dflash::coordinator

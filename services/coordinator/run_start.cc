// Starting a placed run (Coordinator::StartRun): its directory and resume point, its pairs'
// preparation (pair_prepare.cc), then its step loop (RunDriver, run_driver.h) on a thread of its
// own; and the coordinator's side of that loop (RunHost): the run's end, its evaluations' record,
// its workers' release. The step's commit is step_commit.cc.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/config/run_spec.h"
#include "common/data/run_data.h"
#include "common/model/safetensors.h"
#include "common/rpc/run_state.h"
#include "common/run/resolve.h"
#include "common/train/checkpoints.h"
#include "common/train/eval_snapshots.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/evaluation.h"
#include "services/coordinator/placement.h"
#include "services/coordinator/settings_echo.h"
#include "services/coordinator/training.h"

namespace dflash::coordinator {

namespace fs = std::filesystem;

namespace {

// Prompts decoded together by an evaluation during training.
constexpr int64_t kEvalBatch = 16;

}  // namespace

std::string Coordinator::RunDir(const std::string& run_id) const {
  return options_.state_dir.empty() ? std::string()
                                    : (fs::absolute(options_.state_dir) / "runs" / run_id).string();
}

absl::Status Coordinator::SetUpTraining(const Placement& p, Training* t) {
  t->p = p;
  ASSIGN_OR_RETURN(
      t->spec, config::ParseRunSpec(p.resolved_yaml, p.run_id, config::RunSpecOptions{"", true}));
  ASSIGN_OR_RETURN(t->data, data::OpenRunData(t->spec, /*verify=*/true));
  ASSIGN_OR_RETURN(const model::TransformerConfig target, run::RunTargetConfig(t->spec));
  RETURN_IF_ERROR(data::CheckDataVocabulary(t->spec, t->data, target.vocab_size));
  // What the workers will apply for `auto`: logged, shown by `dflashctl status`, and compared
  // with their settings echo.
  ASSIGN_OR_RETURN(t->resolved, ResolveTargetSettings(t->spec, target));
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(store_->SetResolvedTarget(p.run_id, t->resolved));
  }
  const int64_t pairs = static_cast<int64_t>(p.pairs.size());
  ASSIGN_OR_RETURN(t->batching, data::BatchingOptionsFor(t->spec, pairs));
  if (t->spec.optim.max_steps > 0) {
    t->total_steps = t->spec.optim.max_steps;
  } else {
    ASSIGN_OR_RETURN(batching::EpochPlan plan,
                     batching::PlanEpoch(t->data.source(), t->batching, /*epoch=*/0));
    t->total_steps = static_cast<int64_t>(std::ceil(t->spec.optim.epochs * plan.steps()));
  }
  if (t->total_steps < 1) return absl::FailedPreconditionError("the data gives no training step");
  RETURN_IF_ERROR(MakeRunDir(p, t));
  RETURN_IF_ERROR(FindResumePoint(p, t));
  // Logged once the run directory (and its log) exists.
  LOG_RUN(INFO, p.run_id, -1) << "target " << t->spec.target.path << ": "
                              << DescribeResolvedTarget(t->resolved);
  return absl::OkStatus();
}

absl::Status Coordinator::MakeRunDir(const Placement& p, Training* t) {
  t->run_dir = RunDir(p.run_id);
  if (t->run_dir.empty()) return absl::FailedPreconditionError("the coordinator has no state_dir");
  if (t->spec.eval.every_steps > 0) {
    // Unusable prompts fail the run before its first step, not at its first evaluation.
    ASSIGN_OR_RETURN(v1::EvaluateRequest eval, MakeEvaluateRequest(t->spec, ""));
    eval.set_run_id(p.run_id);
    eval.set_batch_size(std::min<int64_t>(eval.prompts_size(), kEvalBatch));
    t->eval_request = std::move(eval);
    std::error_code ec;
    fs::create_directories(fs::path(t->run_dir) / "eval", ec);
    if (ec) return absl::InternalError(absl::StrCat(t->run_dir, "/eval: ", ec.message()));
  }
  t->checkpoint_dir = (fs::path(t->run_dir) / "checkpoints").string();
  t->export_dir = (fs::path(t->run_dir) / "export").string();
  std::error_code ec;
  fs::create_directories(t->checkpoint_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(t->checkpoint_dir, ": ", ec.message()));
  fs::create_directories(fs::path(t->run_dir) / "logs", ec);
  if (ec) return absl::InternalError(absl::StrCat(t->run_dir, "/logs: ", ec.message()));
  OpenRunLog(p.run_id, (fs::path(t->run_dir) / "logs" / "coordinator.log").string());
  {
    std::ofstream yaml(fs::path(t->run_dir) / "run.yaml", std::ios::trunc);
    yaml << "# resolved config of run " << p.run_id << "\n" << p.resolved_yaml;
    if (!yaml) return absl::InternalError(absl::StrCat(t->run_dir, "/run.yaml: cannot write"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::FindResumePoint(const Placement& p, Training* t) {
  // Resume: the newest checkpoint holds the drafter's state and the data cursor after its step.
  // Only one whose step was committed: the drafter writes a checkpoint inside the step it ends,
  // so a step lost after that (a pause or crash before its commit) leaves a checkpoint ahead of
  // the store, which a resume must not jump to.
  int64_t committed = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(v1::RunStatus run, store_->GetRun(p.run_id));
    committed = run.step();
  }
  ASSIGN_OR_RETURN(std::optional<std::string> latest,
                   train::LatestCheckpoint(t->checkpoint_dir, /*max_step=*/committed));
  std::optional<batching::DataCursor> cursor;
  if (latest) {
    ASSIGN_OR_RETURN(auto file, model::SafetensorsFile::Open(*latest));
    auto it = file->header().metadata.find(kCursorKey);
    if (it == file->header().metadata.end()) {
      return absl::DataLossError(absl::StrCat(*latest, ": no ", kCursorKey, " metadata"));
    }
    ASSIGN_OR_RETURN(cursor, batching::ParseCursor(it->second));
    t->resume_from = *latest;
  }
  ASSIGN_OR_RETURN(t->batcher, batching::Batcher::Create(&t->data.source(), t->batching,
                                                         cursor ? &*cursor : nullptr));
  t->step = cursor ? cursor->step : 0;
  return absl::OkStatus();
}

void Coordinator::StartRun(const Placement& p) {
  // Control RPCs run without the lock: a slow worker must not stall heartbeats of the others.
  auto training = std::make_shared<Training>();
  Preparation prep;
  prep.status = SetUpTraining(p, training.get());
  {
    absl::MutexLock lock(&mu_);
    prep.group_prefix =
        absl::StrCat("dflash-", p.run_id, "-", registry_.incarnation(), "-", ++attempts_);
  }
  if (prep.status.ok() && p.pairs.size() > 1) prep.status = CheckDrafterGroup(p.pairs);
  for (size_t i = 0; prep.status.ok() && i < p.pairs.size(); ++i) {
    PreparePair(p, i, *training, &prep);
  }
  if (!ConcludeStart(p, training, prep)) {
    ReleaseWorkers(p);
    CloseRunLog(p.run_id);
    return;
  }
  if (options_.inline_steps) DriveRun(training);
}

bool Coordinator::ConcludeStart(const Placement& p, const std::shared_ptr<Training>& training,
                                const Preparation& prep) {
  bool train = false;
  {
    absl::MutexLock lock(&mu_);
    // The run may have been cancelled or paused while the RPCs ran; then it is no longer ours.
    auto run = store_->GetRun(p.run_id);
    if (Unreachable(prep.status))
      registry_.MarkDown(prep.failed_worker, std::string(prep.status.message()));
    if (run.ok() && run->state() == v1::RUN_STATE_STARTING && Unreachable(prep.status)) {
      // A worker that died but is not yet marked down by the sweep: not the run's fault. Marked
      // down above, so the run is placed again on other workers (or when it comes back).
      absl::Status s =
          TransitionLocked(p.run_id, v1::RUN_STATE_STARTING, v1::RUN_STATE_PAUSED,
                           absl::StrCat("worker unreachable: ", prep.status.message()));
      if (s.ok()) {
        s = TransitionLocked(p.run_id, v1::RUN_STATE_PAUSED, v1::RUN_STATE_QUEUED,
                             "waiting for an idle target/drafter pair");
      }
      if (!s.ok()) {
        LOG_RUN(ERROR, p.run_id, -1) << "cannot requeue: " << s;
      }
    } else if (run.ok() && run->state() == v1::RUN_STATE_STARTING &&
               RetryableOutOfMemory(prep.status) && !oom_prepare_failed_.count(p.run_id)) {
      // Out of memory while loading (another process took memory since the free-memory check):
      // queued again once; the second time the run fails.
      oom_prepare_failed_.insert(p.run_id);
      absl::Status s = TransitionLocked(
          p.run_id, v1::RUN_STATE_STARTING, v1::RUN_STATE_PAUSED,
          absl::StrCat("preparing the run ran out of memory: ", prep.status.message()));
      if (s.ok()) {
        s = TransitionLocked(p.run_id, v1::RUN_STATE_PAUSED, v1::RUN_STATE_QUEUED,
                             "waiting for a pair whose GPUs have room");
      }
      if (!s.ok()) LOG_RUN(ERROR, p.run_id, -1) << "cannot requeue: " << s;
    } else if (run.ok() && run->state() == v1::RUN_STATE_STARTING && !prep.status.ok()) {
      TransitionLocked(p.run_id, v1::RUN_STATE_STARTING, v1::RUN_STATE_FAILED,
                       absl::StrCat("preparing the run failed: ", prep.status.message(),
                                    RetryableOutOfMemory(prep.status)
                                        ? "; out of memory again after waiting for room: lower "
                                          "batching.token_budget or batching.max_anchors, or "
                                          "free the GPU (dflashctl plan shows what fits)"
                                        : ""))
          .IgnoreError();
    } else if (run.ok() && run->state() == v1::RUN_STATE_STARTING && !stopping_) {
      const std::string from =
          training->resume_from.empty()
              ? std::string("from step 0")
              : absl::StrCat("resuming at step ", training->step, " from ",
                             fs::path(training->resume_from).filename().string());
      train = TransitionLocked(p.run_id, v1::RUN_STATE_STARTING, v1::RUN_STATE_RUNNING,
                               absl::StrCat("training ", training->total_steps, " steps ", from,
                                            " (", absl::StrJoin(prep.echoes, "; "), ")"))
                  .ok();
    }
    if (train && metrics_) {
      for (const auto& [role, bytes] : prep.planned_peaks) {
        metrics_->Gauge("dflash_coordinator_plan_peak_bytes")
            .Add({{"run", p.run_id}, {"role", role}})
            .Set(static_cast<double>(bytes));
      }
    }
    UpdateGaugesLocked();
    if (train && !options_.inline_steps) {
      drivers_[p.run_id] = std::thread([this, training] { DriveRun(training); });
    }
  }
  return train;
}

void Coordinator::DriveRun(std::shared_ptr<Training> t) {
  RunDriver(this, workers_, clock_, t).Run();
  ReleaseWorkers(t->p);
  CloseRunLog(t->p.run_id);
  absl::MutexLock lock(&mu_);
  auto it = drivers_.find(t->p.run_id);
  if (it != drivers_.end()) {
    it->second.detach();  // this thread, ending now
    drivers_.erase(it);
  }
}

bool Coordinator::StillRunning(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  auto run = store_->GetRun(run_id);
  return !stopping_ && run.ok() && run->state() == v1::RUN_STATE_RUNNING;
}

void Coordinator::MarkDown(const std::string& worker_id, const std::string& why) {
  absl::MutexLock lock(&mu_);
  registry_.MarkDown(worker_id, why);
}

void Coordinator::EndRun(const Training& t, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  const std::string& run_id = t.p.run_id;
  auto run = store_->GetRun(run_id);
  if (!run.ok() || run->state() != v1::RUN_STATE_RUNNING) return;  // cancelled or paused
  absl::Status s;
  if (status.ok()) {
    s = TransitionLocked(
        run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_DONE,
        absl::StrCat("trained ", t.total_steps, " steps; drafter exported to ", t.export_dir));
  } else if (Unreachable(status)) {
    // A worker went away mid-step: the run waits for workers and resumes from its checkpoint.
    s = TransitionLocked(run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_PAUSED,
                         std::string(status.message()));
  } else if (RetryableOutOfMemory(status)) {
    // Out of memory where halving the micro-batch could not help (the optimizer step, a backward
    // that had begun adding to shared gradients, a read back, another process taking memory):
    // the run pauses and resumes from its newest checkpoint once placed again (placement waits
    // for free memory). The same failure at the same step after that fails the run.
    auto again = oom_paused_at_.find(run_id);
    if (again != oom_paused_at_.end() && again->second == t.step) {
      s = TransitionLocked(
          run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_FAILED,
          absl::StrCat(status.message(), "; out of memory again at step ", t.step,
                       " after resuming: lower batching.token_budget or batching.max_anchors, or "
                       "set drafter.recompute (dflashctl plan shows what fits)"));
    } else {
      oom_paused_at_[run_id] = t.step;
      s = TransitionLocked(run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_PAUSED,
                           absl::StrCat(status.message(),
                                        "; paused: resumes from its newest checkpoint when its "
                                        "GPUs have room"));
    }
  } else {
    s = TransitionLocked(run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_FAILED,
                         std::string(status.message()));
  }
  if (!s.ok()) {
    LOG_RUN(ERROR, run_id, -1) << "cannot end the run: " << s;
  }
  UpdateGaugesLocked();
}

void Coordinator::ReleaseWorkers(const Placement& p) {
  std::vector<v1::WorkerInfo> all;
  for (const auto& [target, drafter] : p.pairs) {
    all.push_back(target);
    all.push_back(drafter);
  }
  for (const auto& ranks : p.target_ranks) all.insert(all.end(), ranks.begin(), ranks.end());
  for (const auto& w : all) {
    {
      // A worker marked down is not called (it may hang); it drops the run when it heartbeats
      // again and the reply no longer names it.
      absl::MutexLock lock(&mu_);
      auto now = registry_.Get(w.worker_id());
      if (now.ok() && now->health() == v1::WORKER_HEALTH_DOWN) continue;
    }
    absl::Status s = workers_->ReleaseRun(w, p.run_id);
    if (!s.ok()) {
      LOG_RUN(WARNING, p.run_id, -1) << "release: " << s;
    }
  }
}

void Coordinator::EvaluationStarted(const std::string& run_id, const v1::EvalInProgress& e) {
  absl::MutexLock lock(&mu_);
  evaluating_[run_id] = e;
}

void Coordinator::EvaluationEnded(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  evaluating_.erase(run_id);
}

void Coordinator::RecordEval(const std::string& run_id, const v1::EvalResult& r) {
  absl::MutexLock lock(&mu_);
  last_evals_[run_id] = r;
  if (metrics_) {
    const prometheus::Labels l = {{"run", run_id}};
    metrics_->Gauge("dflash_coordinator_run_measured_acceptance_length").Add(l).Set(r.tau());
    metrics_->Gauge("dflash_coordinator_run_eval_tokens_per_second")
        .Add(l)
        .Set(r.tokens_per_second());
    for (const v1::EvalContextBucket& c : r.by_context()) {
      metrics_->Gauge("dflash_coordinator_run_acceptance_length_by_context")
          .Add({{"run", run_id}, {"context", c.range()}})
          .Set(c.tau());
    }
    for (int k = 1; k < r.acceptance_by_position_size(); ++k) {
      metrics_->Gauge("dflash_coordinator_run_acceptance_by_position")
          .Add({{"run", run_id}, {"position", std::to_string(k)}})
          .Set(r.acceptance_by_position(k));
    }
  }
}

void Coordinator::FillProgressLocked(v1::RunStatus* run) {
  run->set_run_dir(RunDir(run->run_id()));
  if (auto it = evaluating_.find(run->run_id()); it != evaluating_.end()) {
    *run->mutable_evaluating() = it->second;
  }
  if (auto it = last_evals_.find(run->run_id()); it != last_evals_.end()) {
    *run->mutable_last_eval() = it->second;
  } else if (!run->run_dir().empty()) {
    // After a coordinator restart: the newest line of the run's evaluation log.
    std::ifstream in(fs::path(run->run_dir()) / "eval" / "results.jsonl");
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    if (!last.empty()) {
      (void)google::protobuf::util::JsonStringToMessage(last, run->mutable_last_eval());
    }
  }
  if (!run->run_dir().empty()) {
    absl::StatusOr<std::optional<train::EvalSnapshot>> best = train::ReadBestEval(run->run_dir());
    if (best.ok() && best->has_value()) {
      v1::BestEval* b = run->mutable_best_eval();
      b->set_step((*best)->step);
      b->set_tau((*best)->tau);
      b->set_drafter_dir((*best)->dir);
    }
  }
  auto last = store_->LastCommittedStep(run->run_id());
  if (!last.ok() || !last->has_value()) return;
  v1::StepMetrics m;
  if (google::protobuf::util::JsonStringToMessage((*last)->metrics, &m).ok()) {
    *run->mutable_last_step() = m;
  }
}

Coordinator::~Coordinator() {
  std::map<std::string, std::thread> drivers;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    drivers.swap(drivers_);
  }
  for (auto& [id, thread] : drivers) {
    if (thread.joinable()) thread.join();
  }
}

}  // namespace dflash::coordinator

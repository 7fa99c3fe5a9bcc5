// The coordinator's step pipeline (architecture.md): a placed run's workers are prepared (with the
// run's newest checkpoint when it resumes), then each optimizer step is planned here (packing,
// anchors), sent to every target and drafter of the run at once, checked (the drafter must have
// trained on exactly the features its target sent) and committed to the run store exactly once,
// in order, before the next step starts. Checkpoints and the final export are written by the
// drafter into the run directory when the step that ends them asks for it.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/batching/anchors.h"
#include "common/batching/packed_batch.h"
#include "common/config/run_spec.h"
#include "common/data/run_data.h"
#include "common/model/safetensors.h"
#include "common/plan/memory_plan.h"
#include "common/rpc/run_state.h"
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

constexpr char kCursorKey[] = "data.cursor";  // as LocalRun writes it (common/train/local_run.cc)

bool Unreachable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// An out-of-memory that a retry from the checkpoint may get past: every one but a single
// document that did not fit (the trainer's and the target's "not recoverable: ... one document
// of N tokens", which only a smaller data.max_length or token_budget fixes).
bool RetryableOutOfMemory(const absl::Status& s) {
  return s.code() == absl::StatusCode::kResourceExhausted &&
         !absl::StrContains(s.message(), "one document of");
}

// Prompts decoded together by an evaluation during training.
constexpr int64_t kEvalBatch = 16;

std::string EvalSnapshotDir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "eval" / absl::StrFormat("step-%012d", step)).string();
}

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
  t->last_commit = std::chrono::steady_clock::now();  // the first step's time excludes Prepare
  while (RunOneStep(t.get())) {
  }
  ReleaseWorkers(t->p);
  CloseRunLog(t->p.run_id);
  absl::MutexLock lock(&mu_);
  auto it = drivers_.find(t->p.run_id);
  if (it != drivers_.end()) {
    it->second.detach();  // this thread, ending now
    drivers_.erase(it);
  }
}

absl::StatusOr<std::unique_ptr<Coordinator::PlannedStep>> Coordinator::PlanStep(Training* t) {
  auto ps = std::make_unique<PlannedStep>();
  absl::StatusOr<batching::StepPlan> plan = t->batcher->NextStep();
  if (!plan.ok()) return Annotate(plan.status(), "planning the step");
  const int64_t step = plan->step;
  ps->step = step;
  ps->epoch = plan->epoch;
  ps->cursor = batching::SerializeCursor(t->batcher->cursor());
  const bool last = step + 1 == t->total_steps;
  const int64_t every = t->spec.checkpoint.every_steps;
  ps->targets.resize(t->p.pairs.size());
  ps->drafters.resize(t->p.pairs.size());
  for (size_t i = 0; i < t->p.pairs.size(); ++i) {
    for (v1::RunStepRequest* r : {&ps->targets[i], &ps->drafters[i]}) {
      r->set_run_id(t->p.run_id);
      r->set_step(step);
      r->set_epoch(plan->epoch);
    }
    // Data-parallel drafters hold identical weights and optimizer state: pair 0's writes them.
    if (i == 0 && (last || (every > 0 && (step + 1) % every == 0))) {
      ps->drafters[i].set_checkpoint_path(train::CheckpointPath(t->checkpoint_dir, step + 1));
      (*ps->drafters[i].mutable_checkpoint_metadata())[kCursorKey] = ps->cursor;
    }
    if (i == 0 && last) ps->drafters[i].set_export_dir(t->export_dir);
  }
  const int64_t eval_every = t->spec.eval.every_steps;
  if (t->eval_request && (last || (step + 1) % eval_every == 0)) {
    ps->eval_dir = last ? t->export_dir : EvalSnapshotDir(t->run_dir, step + 1);
    ps->drafters[0].set_export_dir(ps->eval_dir);
  }
  for (const batching::MicroBatchPlan& mb : plan->micro_batches) {
    absl::Status s = batching::MaterializeBatch(t->data.source(), mb.pieces,
                                                t->batching.token_budget, &t->scratch);
    absl::StatusOr<std::vector<int32_t>> anchors =
        s.ok() ? batching::SampleAnchors(t->scratch.loss_mask, t->scratch.doc_ids,
                                         t->spec.batching.max_anchors, mb.anchor_seed)
               : absl::StatusOr<std::vector<int32_t>>(s);
    if (!anchors.ok()) return Annotate(anchors.status(), absl::StrCat("step ", step));
    // Unique in the run and the same for both sides: (step + 1) in the high bits, the
    // micro-batch's index within its pair's step in the low 20.
    const uint64_t batch_id =
        (static_cast<uint64_t>(step + 1) << 20) | static_cast<uint64_t>(mb.index_in_step);
    v1::MicroBatch* to_target = ps->targets[mb.pair].add_micro_batches();
    v1::MicroBatch* to_drafter = ps->drafters[mb.pair].add_micro_batches();
    to_target->set_batch_id(batch_id);
    to_drafter->set_batch_id(batch_id);
    for (const batching::Piece& piece : mb.pieces) {
      v1::Piece* q = to_target->add_pieces();
      q->set_document(piece.document);
      q->set_begin(piece.begin);
      q->set_length(piece.length);
    }
    to_drafter->mutable_anchors()->Add(anchors->begin(), anchors->end());
    to_target->set_tokens(t->scratch.total_tokens);
    to_drafter->set_tokens(t->scratch.total_tokens);
    ps->tokens += t->scratch.total_tokens;
  }
  return ps;
}

void Coordinator::Dispatch(Training* t, PlannedStep* ps, bool drafters) {
  // The first failure releases every worker of the run, which aborts the channels, so that no
  // peer waits out its deadline for a partner that has given up.
  auto& calls = drafters ? ps->drafter_calls : ps->target_calls;
  std::vector<std::pair<v1::WorkerInfo, size_t>> called;  // (worker, pair)
  for (size_t i = 0; i < t->p.pairs.size(); ++i) {
    called.emplace_back(drafters ? t->p.pairs[i].second : t->p.pairs[i].first, i);
  }
  for (size_t i = 0; !drafters && i < t->p.target_ranks.size(); ++i) {
    for (const v1::WorkerInfo& w : t->p.target_ranks[i]) called.emplace_back(w, i);
  }
  for (size_t c = 0; c < called.size(); ++c) {
    const v1::WorkerInfo w = called[c].first;
    const size_t i = called[c].second;
    const v1::RunStepRequest* req = drafters ? &ps->drafters[i] : &ps->targets[i];
    if (c >= t->p.pairs.size()) ps->tp_pair.push_back(i);
    auto& into = c < t->p.pairs.size() ? calls : ps->tp_calls;
    into.push_back(std::async(std::launch::async, [this, t, w, req] {
      absl::StatusOr<v1::RunStepResponse> r = workers_->RunStep(w, *req);
      if (!r.ok()) {
        if (Unreachable(r.status())) {
          absl::MutexLock lock(&mu_);
          registry_.MarkDown(w.worker_id(), std::string(r.status().message()));
        }
        ReleaseWorkers(t->p);
      }
      return r;
    }));
  }
}

bool Coordinator::RunOneStep(Training* t) {
  {
    absl::MutexLock lock(&mu_);
    auto run = store_->GetRun(t->p.run_id);
    if (stopping_ || !run.ok() || run->state() != v1::RUN_STATE_RUNNING) return false;
  }
  if (t->step >= t->total_steps) {
    EndRun(t, absl::OkStatus());
    return false;
  }
  // This step's targets may already be at work: dispatched when the previous step's targets
  // finished (run-ahead of one step; the feature channel's slots bound it further).
  std::unique_ptr<PlannedStep> cur = std::move(t->ahead);
  if (!cur) {
    absl::StatusOr<std::unique_ptr<PlannedStep>> planned = PlanStep(t);
    if (!planned.ok()) {
      EndRun(t, planned.status());
      return false;
    }
    cur = *std::move(planned);
    Dispatch(t, cur.get(), /*drafters=*/false);
  }
  Dispatch(t, cur.get(), /*drafters=*/true);
  StepResults results = AwaitStep(t, cur.get());
  if (absl::Status s = CheckStepResults(*cur, results); !s.ok()) {
    EndRun(t, s);
    return false;
  }
  if (!cur->eval_dir.empty()) EvaluateBeforeCommit(t, *cur, &results);
  if (!CommitStep(t, *cur, results)) return false;
  t->step = cur->step + 1;
  if (!t->ahead_error.ok()) {
    EndRun(t, t->ahead_error);
    return false;
  }
  return true;
}

Coordinator::StepResults Coordinator::AwaitStep(Training* t, PlannedStep* cur) {
  StepResults r;
  r.pairs.resize(cur->drafter_calls.size());
  for (size_t i = 0; i < r.pairs.size(); ++i) r.pairs[i].target = cur->target_calls[i].get();
  for (size_t c = 0; c < cur->tp_calls.size(); ++c) {
    r.tp_ranks.push_back({cur->tp_pair[c], cur->tp_calls[c].get()});
  }
  bool targets_ok = true;
  for (const PairResult& p : r.pairs) targets_ok = targets_ok && p.target.ok();
  for (const TpRankResult& tp : r.tp_ranks) targets_ok = targets_ok && tp.result.ok();
  if (targets_ok && cur->step + 1 < t->total_steps) {
    // Run ahead: plan the next step and start its targets while the drafters train on this one.
    absl::StatusOr<std::unique_ptr<PlannedStep>> next = PlanStep(t);
    if (next.ok()) {
      t->ahead = *std::move(next);
      Dispatch(t, t->ahead.get(), /*drafters=*/false);
    } else {
      t->ahead_error = next.status();  // reported after this step commits
    }
  }
  for (size_t i = 0; i < r.pairs.size(); ++i) r.pairs[i].drafter = cur->drafter_calls[i].get();
  return r;
}

absl::Status Coordinator::CheckStepResults(const PlannedStep& cur, const StepResults& r) {
  const int64_t step = cur.step;
  absl::Status failed;
  for (const TpRankResult& tp : r.tp_ranks) {
    if (!tp.result.ok() && failed.ok()) failed = tp.result.status();
  }
  for (const PairResult& p : r.pairs) {
    for (const auto* call : {&p.target, &p.drafter}) {
      // The root cause, not the ABORTED of a peer that was released because of it.
      if (!call->ok() && (failed.ok() || failed.code() == absl::StatusCode::kAborted)) {
        failed = call->status();
      }
    }
  }
  if (!failed.ok()) return Annotate(failed, absl::StrCat("step ", step));
  for (const TpRankResult& tp : r.tp_ranks) {
    // Every rank of a tensor-parallel target holds the same residual stream: on host transport
    // (the ranks report the CRC of the same feature message) the features must be equal.
    const uint64_t rank0 = r.pairs[tp.pair].target->checksum(), other = tp.result->checksum();
    if (other != 0 && other != rank0) {
      return absl::DataLossError(
          absl::StrCat("step ", step, ": pair ", tp.pair,
                       ": tensor-parallel target ranks computed different features (checksum ",
                       other, " != rank 0's ", rank0, ")"));
    }
  }
  for (size_t i = 0; i < r.pairs.size(); ++i) {
    const uint64_t sent = r.pairs[i].target->checksum(), trained = r.pairs[i].drafter->checksum();
    if (sent != trained) {
      return absl::DataLossError(absl::StrCat("step ", step, ": pair ", i,
                                              " trained on other features than its target "
                                              "sent (checksum ",
                                              trained, " != ", sent, ")"));
    }
  }
  return absl::OkStatus();
}

void Coordinator::EvaluateBeforeCommit(Training* t, const PlannedStep& cur, StepResults* r) {
  // Measured before the commit, so that the committed step carries it (an evaluation that fails
  // is logged and skipped: it never stops training).
  const auto eval_start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::EvalResult> eval = Evaluate(t, cur.eval_dir, cur.step + 1);
  // The step's time (now - last commit) leaves the decoding out.
  t->last_commit += std::chrono::steady_clock::now() - eval_start;
  if (eval.ok()) {
    r->pairs[0].drafter->mutable_metrics()->set_measured_acceptance_length(eval->tau());
  } else {
    LOG_RUN(WARNING, t->p.run_id, cur.step)
        << "evaluation of " << cur.eval_dir << " failed: " << eval.status();
  }
}

void Coordinator::EndRun(Training* t, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  const std::string& run_id = t->p.run_id;
  auto run = store_->GetRun(run_id);
  if (!run.ok() || run->state() != v1::RUN_STATE_RUNNING) return;  // cancelled or paused
  absl::Status s;
  if (status.ok()) {
    s = TransitionLocked(
        run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_DONE,
        absl::StrCat("trained ", t->total_steps, " steps; drafter exported to ", t->export_dir));
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
    if (again != oom_paused_at_.end() && again->second == t->step) {
      s = TransitionLocked(
          run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_FAILED,
          absl::StrCat(status.message(), "; out of memory again at step ", t->step,
                       " after resuming: lower batching.token_budget or batching.max_anchors, or "
                       "set drafter.recompute (dflashctl plan shows what fits)"));
    } else {
      oom_paused_at_[run_id] = t->step;
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

absl::StatusOr<v1::EvalResult> Coordinator::Evaluate(Training* t, const std::string& dir,
                                                     int64_t step) {
  const std::string& run_id = t->p.run_id;
  v1::EvaluateRequest req = *t->eval_request;
  req.set_drafter_dir(dir);
  req.set_step(step);
  const v1::WorkerInfo& worker = t->p.pairs[0].first;  // pair 0's target
  const int64_t start = clock_->NowUnixMs();
  ASSIGN_OR_RETURN(v1::EvaluateResponse resp, workers_->Evaluate(worker, req));
  v1::EvalResult r = ToEvalResult(resp, worker.name(), dir, step, start);
  LOG_RUN(INFO, run_id, step - 1) << absl::StrFormat(
      "evaluated the drafter of step %d: tau %.3f over %d prompts (%d tokens, %.1f tokens/s)", step,
      r.tau(), r.prompts(), r.new_tokens(), r.tokens_per_second());
  // The run's evaluations, one JSON line each, kept with the run (dflashctl status reads the last).
  // The field names and shape of `dflashctl eval -o json` (proto names, every field).
  google::protobuf::util::JsonPrintOptions json_options;
  json_options.preserve_proto_field_names = true;
  json_options.always_print_primitive_fields = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(r, &json, json_options);
  {
    std::ofstream out(fs::path(t->run_dir) / "eval" / "results.jsonl", std::ios::app);
    out << json << "\n";
  }
  // The newest snapshot and the one of the best held-out tau are kept (the final export is the
  // run's own); eval/best.json names the best, for `dflashctl export --best`.
  absl::StatusOr<train::EvalSnapshot> best = train::RecordEval(t->run_dir, {step, r.tau(), dir});
  if (!best.ok()) {
    LOG_RUN(WARNING, run_id, step - 1) << "best evaluation not recorded: " << best.status();
  }
  train::PruneEvalSnapshots(t->run_dir, {dir, best.ok() ? best->dir : dir});
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
  return r;
}

void Coordinator::FillProgressLocked(v1::RunStatus* run) {
  run->set_run_dir(RunDir(run->run_id()));
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

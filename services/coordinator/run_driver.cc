// The step loop of a started run (run_driver.h): planning, dispatch with run-ahead, the checks,
// evaluation during training and the commit through the coordinator (RunHost). Checkpoints and
// the final export are written by the drafter into the run directory when the step that ends
// them asks for it.
#include "services/coordinator/run_driver.h"

#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/batching/anchors.h"
#include "common/batching/packed_batch.h"
#include "common/train/checkpoints.h"
#include "common/train/eval_snapshots.h"
#include "services/coordinator/decode_group.h"
#include "services/coordinator/evaluation.h"
#include "services/coordinator/training.h"

namespace dflash::coordinator {

namespace fs = std::filesystem;

namespace {

std::string EvalSnapshotDir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "eval" / absl::StrFormat("step-%012d", step)).string();
}

}  // namespace

RunDriver::RunDriver(RunHost* host, WorkerControl* workers, const Clock* clock,
                     std::shared_ptr<Training> training)
    : host_(host), workers_(workers), clock_(clock), t_(std::move(training)) {}

void RunDriver::Run() {
  t_->last_commit = std::chrono::steady_clock::now();  // the first step's time excludes Prepare
  while (RunOneStep()) {
  }
  CollectEvaluation(/*wait=*/true);  // its task uses this driver
}

absl::StatusOr<std::unique_ptr<PlannedStep>> RunDriver::PlanStep() {
  Training* const t = t_.get();
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

void RunDriver::Dispatch(PlannedStep* ps, bool drafters) {
  Training* const t = t_.get();
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
    // The calls may outlive this driver (the next step's, run ahead, end with the Training).
    into.push_back(std::async(std::launch::async, [host = host_, workers = workers_, t, w, req] {
      absl::StatusOr<v1::RunStepResponse> r = workers->RunStep(w, *req);
      if (!r.ok()) {
        if (Unreachable(r.status()))
          host->MarkDown(w.worker_id(), std::string(r.status().message()));
        host->ReleaseWorkers(t->p);
      }
      return r;
    }));
  }
}

bool RunDriver::RunOneStep() {
  Training* const t = t_.get();
  if (!host_->StillRunning(t->p.run_id)) return false;
  if (t->step >= t->total_steps) {
    host_->EndRun(*t, absl::OkStatus());
    return false;
  }
  // This step's targets may already be at work: dispatched when the previous step's targets
  // finished (run-ahead of one step; the feature channel's slots bound it further).
  std::unique_ptr<PlannedStep> cur = std::move(t->ahead);
  if (!cur) {
    absl::StatusOr<std::unique_ptr<PlannedStep>> planned = PlanStep();
    if (!planned.ok()) {
      host_->EndRun(*t, planned.status());
      return false;
    }
    cur = *std::move(planned);
    Dispatch(cur.get(), /*drafters=*/false);
  }
  // A step whose drafter exports the next snapshot waits for the previous evaluation, whose end
  // prunes the snapshot directories other than its own and the best.
  if (!cur->eval_dir.empty()) CollectEvaluation(/*wait=*/true);
  Dispatch(cur.get(), /*drafters=*/true);
  StepResults results = AwaitStep(cur.get());
  if (absl::Status s = CheckStepResults(*cur, results); !s.ok()) {
    host_->EndRun(*t, s);
    return false;
  }
  // The evaluation runs beside the next steps; the last one (of the export) ends the run, so it
  // is waited for.
  if (!cur->eval_dir.empty()) StartEvaluation(*cur);
  CollectEvaluation(/*wait=*/cur->step + 1 == t->total_steps);
  if (t->eval_tau) {
    // The measured tau of the newest evaluation that ended, with the first commit after it.
    results.pairs[0].drafter->mutable_metrics()->set_measured_acceptance_length(*t->eval_tau);
    t->eval_tau.reset();
  }
  if (!CommitStep(*cur, results)) return false;
  t->step = cur->step + 1;
  // Between steps (EvaluatesBetweenSteps): the next step starts when the evaluation has ended.
  if (!cur->eval_dir.empty() && EvaluatesBetweenSteps()) CollectEvaluation(/*wait=*/true);
  if (!t->ahead_error.ok()) {
    host_->EndRun(*t, t->ahead_error);
    return false;
  }
  return true;
}

RunDriver::StepResults RunDriver::AwaitStep(PlannedStep* cur) {
  Training* const t = t_.get();
  StepResults r;
  r.pairs.resize(cur->drafter_calls.size());
  for (size_t i = 0; i < r.pairs.size(); ++i) r.pairs[i].target = cur->target_calls[i].get();
  for (size_t c = 0; c < cur->tp_calls.size(); ++c) {
    r.tp_ranks.push_back({cur->tp_pair[c], cur->tp_calls[c].get()});
  }
  bool targets_ok = true;
  for (const PairResult& p : r.pairs) targets_ok = targets_ok && p.target.ok();
  for (const TpRankResult& tp : r.tp_ranks) targets_ok = targets_ok && tp.result.ok();
  // No target ahead of a step whose evaluation the steps wait for: its forwards' collectives
  // would run beside the decoding group's.
  const bool evaluation_next = !cur->eval_dir.empty() && EvaluatesBetweenSteps();
  if (targets_ok && cur->step + 1 < t->total_steps && !evaluation_next) {
    // Run ahead: plan the next step and start its targets while the drafters train on this one.
    absl::StatusOr<std::unique_ptr<PlannedStep>> next = PlanStep();
    if (next.ok()) {
      t->ahead = *std::move(next);
      Dispatch(t->ahead.get(), /*drafters=*/false);
    } else {
      t->ahead_error = next.status();  // reported after this step commits
    }
  }
  for (size_t i = 0; i < r.pairs.size(); ++i) r.pairs[i].drafter = cur->drafter_calls[i].get();
  return r;
}

absl::Status RunDriver::CheckStepResults(const PlannedStep& cur, const StepResults& r) {
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

void RunDriver::StartEvaluation(const PlannedStep& cur) {
  Training* const t = t_.get();
  CollectEvaluation(/*wait=*/true);  // one at a time
  v1::EvalInProgress e;
  e.set_step(cur.step + 1);
  e.set_worker(GroupNames(EvaluationGroup()));  // "t0|t1": a target and its tensor-parallel ranks
  e.set_reserved(!t->p.eval_group.empty());
  // A tensor-parallel target on GPUs: its ranks' decoding group and the run's group would run
  // NCCL collectives at once, in orders the ranks do not share, which NCCL does not promise to
  // complete; the steps wait for the evaluation instead (docs/models.md).
  const bool between_steps = EvaluatesBetweenSteps();
  e.set_between_steps(between_steps);
  e.set_drafter_dir(cur.eval_dir);
  e.set_started_unix_ms(clock_->NowUnixMs());
  host_->EvaluationStarted(t->p.run_id, e);
  // Run() waits for it before the driver goes away (CollectEvaluation).
  t->running_eval = std::async(std::launch::async, [this, dir = cur.eval_dir, step = cur.step] {
    absl::StatusOr<v1::EvalResult> eval = Evaluate(dir, step + 1);
    if (!eval.ok()) {
      LOG_RUN(WARNING, t_->p.run_id, step)
          << "evaluation of " << dir << " failed: " << eval.status();
    }
    host_->EvaluationEnded(t_->p.run_id);
    return eval;
  });
}

bool RunDriver::EvaluatesBetweenSteps() const {
  const Training* const t = t_.get();
  // A reserved group decodes on processes (and GPUs) that carry none of the run's collectives.
  return t->p.eval_group.empty() && !t->p.target_ranks.empty() && !t->p.target_ranks[0].empty() &&
         t->p.pairs[0].first.device().kind() == "cuda";
}

DecodeGroupWorkers RunDriver::EvaluationGroup() const {
  const Training* const t = t_.get();
  if (!t->p.eval_group.empty()) return t->p.eval_group;
  // Pair 0's target: its tensor-parallel ranks decode together over a group of their own (the
  // run's group carries the steps' sums meanwhile).
  DecodeGroupWorkers group = {t->p.pairs[0].first};
  if (!t->p.target_ranks.empty()) {
    group.insert(group.end(), t->p.target_ranks[0].begin(), t->p.target_ranks[0].end());
  }
  return group;
}

void RunDriver::CollectEvaluation(bool wait) {
  Training* const t = t_.get();
  if (!t->running_eval) return;
  if (!wait && t->running_eval->wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    return;
  }
  const auto wait_start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::EvalResult> eval = t->running_eval->get();
  t->running_eval.reset();
  // The step's time (now - last commit) leaves out what it waited for the decoding.
  t->last_commit += std::chrono::steady_clock::now() - wait_start;
  if (eval.ok()) t->eval_tau = eval->tau();
}

absl::StatusOr<v1::EvalResult> RunDriver::Evaluate(const std::string& dir, int64_t step) {
  Training* const t = t_.get();
  const std::string& run_id = t->p.run_id;
  v1::EvaluateRequest req = *t->eval_request;
  req.set_drafter_dir(dir);
  req.set_step(step);
  const DecodeGroupWorkers group = EvaluationGroup();
  const int64_t start = clock_->NowUnixMs();
  ASSIGN_OR_RETURN(v1::EvaluateResponse resp, EvaluateOnGroup(group, req, workers_));
  v1::EvalResult r = ToEvalResult(resp, GroupNames(group), dir, step, start);
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
  host_->RecordEval(run_id, r);
  return r;
}

v1::StepMetrics RunDriver::StepMetricsOf(const Training& t, const PlannedStep& cur,
                                         const StepResults& r,
                                         std::chrono::steady_clock::time_point now) {
  // Pair 0's drafter: its loss, weight sum and slot counts are the sums over all pairs.
  v1::StepMetrics metrics = r.pairs[0].drafter->metrics();
  int64_t oom_splits = 0;  // targets' (every tensor-parallel rank) and drafters'
  for (const PairResult& p : r.pairs) {
    oom_splits += p.target->metrics().oom_splits() + p.drafter->metrics().oom_splits();
  }
  for (const TpRankResult& tp : r.tp_ranks) oom_splits += tp.result->metrics().oom_splits();
  metrics.set_oom_splits(oom_splits);
  metrics.set_tokens(cur.tokens);
  // From the previous commit (or the start of the step loop): with the targets running ahead,
  // the time between commits is what a step costs.
  metrics.set_seconds(std::chrono::duration<double>(now - t.last_commit).count());
  return metrics;
}

bool RunDriver::CommitStep(const PlannedStep& cur, const StepResults& r) {
  Training* const t = t_.get();
  const std::string& run_id = t->p.run_id;
  const int64_t step = cur.step;
  const auto now = std::chrono::steady_clock::now();
  const v1::StepMetrics metrics = StepMetricsOf(*t, cur, r, now);
  if (!host_->CommitStep(run_id, step, cur.epoch, cur.cursor, metrics)) return false;
  LOG_RUN(INFO, run_id, step)
      << absl::StrFormat("loss %.4f  acc.len %.3f  grad %.3g  lr %.3g  %d tok  %.2f s%s",
                         metrics.loss(), metrics.acceptance_length(), metrics.grad_norm(),
                         metrics.lr(), cur.tokens, metrics.seconds(),
                         metrics.skipped() ? "  SKIPPED" : "")
      << (metrics.oom_splits() > 0
              ? absl::StrCat("  out of memory: ", metrics.oom_splits(), " micro-batch(es) split")
              : std::string());
  t->last_commit = now;
  if (!cur.drafters[0].checkpoint_path().empty()) {
    if (absl::Status s = train::PruneCheckpoints(t->checkpoint_dir, t->spec.checkpoint.keep);
        !s.ok()) {
      LOG_RUN(WARNING, run_id, step) << "pruning checkpoints: " << s;
    }
  }
  return true;
}

}  // namespace dflash::coordinator

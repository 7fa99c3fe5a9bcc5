// The commit of a trained step (Coordinator::CommitStep): the step's figures from its results,
// the run store's exactly-once commit, the run's metrics, the step's log line and checkpoint
// pruning.
#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/train/checkpoints.h"
#include "services/coordinator/training.h"

namespace dflash::coordinator {

v1::StepMetrics Coordinator::StepMetricsOf(const Training& t, const PlannedStep& cur,
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

bool Coordinator::CommitStep(Training* t, const PlannedStep& cur, const StepResults& r) {
  const std::string& run_id = t->p.run_id;
  const int64_t step = cur.step;
  const auto now = std::chrono::steady_clock::now();
  const v1::StepMetrics metrics = StepMetricsOf(*t, cur, r, now);
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(metrics, &json);
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<bool> committed =
        store_->CommitStep(run_id, step, cur.cursor, json, clock_->NowUnixMs());
    if (!committed.ok()) {
      auto run = store_->GetRun(run_id);
      if (run.ok() && run->state() == v1::RUN_STATE_RUNNING) {
        LOG_RUN(ERROR, run_id, step) << "commit: " << committed.status();
        TransitionLocked(run_id, v1::RUN_STATE_RUNNING, v1::RUN_STATE_FAILED,
                         absl::StrCat("step ", step, ": ", committed.status().message()))
            .IgnoreError();
      }
      UpdateGaugesLocked();
      return false;
    }
    if (metrics_ && *committed) ExportStepMetricsLocked(run_id, cur.epoch, metrics);
    UpdateGaugesLocked();
    events_cv_.SignalAll();
  }
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

void Coordinator::ExportStepMetricsLocked(const std::string& run_id, int64_t epoch,
                                          const v1::StepMetrics& m) {
  const prometheus::Labels l = {{"run", run_id}};
  metrics_->Gauge("dflash_coordinator_run_loss").Add(l).Set(m.loss());
  metrics_->Gauge("dflash_coordinator_run_acceptance_length").Add(l).Set(m.acceptance_length());
  metrics_->Gauge("dflash_coordinator_run_tokens_per_second")
      .Add(l)
      .Set(m.seconds() > 0 ? static_cast<double>(m.tokens()) / m.seconds() : 0);
  metrics_->Counter("dflash_coordinator_run_tokens_total")
      .Add(l)
      .Increment(static_cast<double>(m.tokens()));
  metrics_->Gauge("dflash_coordinator_run_epoch").Add(l).Set(static_cast<double>(epoch));
  metrics_->Gauge("dflash_coordinator_run_grad_norm").Add(l).Set(m.grad_norm());
  metrics_->Gauge("dflash_coordinator_run_learning_rate").Add(l).Set(m.lr());
  for (int k = 0; k < m.slot_accuracy_size(); ++k) {
    metrics_->Gauge("dflash_coordinator_run_slot_accuracy")
        .Add({{"run", run_id}, {"slot", std::to_string(k)}})
        .Set(m.slot_accuracy(k));
  }
  // Created at 0 with the run's first step, so that "no skipped step" is a sample too.
  auto& skipped = metrics_->Counter("dflash_coordinator_run_skipped_steps_total").Add(l);
  if (m.skipped()) skipped.Increment();
  metrics_->Counter("dflash_coordinator_run_oom_splits_total")
      .Add(l)
      .Increment(static_cast<double>(m.oom_splits()));
}

}  // namespace dflash::coordinator

// The coordinator's side of a trained step's commit (RunHost::CommitStep): the run store's
// exactly-once commit, the run's metrics and events. The step's figures, log line and checkpoint
// pruning are the step loop's (run_driver.cc).
#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "services/coordinator/coordinator.h"

namespace dflash::coordinator {

bool Coordinator::CommitStep(const std::string& run_id, int64_t step, int64_t epoch,
                             const std::string& cursor, const v1::StepMetrics& metrics) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(metrics, &json);
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<bool> committed =
        store_->CommitStep(run_id, step, cursor, json, clock_->NowUnixMs());
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
    if (metrics_ && *committed) ExportStepMetricsLocked(run_id, epoch, metrics);
    UpdateGaugesLocked();
    events_cv_.SignalAll();
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

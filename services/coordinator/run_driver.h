// A started run's step loop (architecture.md, "A run's life today"), apart from the coordinator
// that placed it: each optimizer step is planned here (packing, anchors), sent to every target and
// drafter of the run at once (the next step's targets run ahead while the drafters train), checked
// (the drafter must have trained on exactly the features its target sent), evaluated when
// eval.every_steps asks, and committed through the host exactly once, in order, before the next
// step starts. What the loop needs of the coordinator is RunHost: the run's state, the store's
// commit, the run's end, its metrics and its workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "dflash/v1/common.pb.h"
#include "dflash/v1/coordinator.pb.h"
#include "dflash/v1/worker.pb.h"
#include "services/coordinator/decode_group.h"
#include "services/coordinator/placement.h"
#include "services/coordinator/worker_control.h"

namespace dflash::coordinator {

struct Training;     // training.h
struct PlannedStep;  // training.h

// The coordinator as a run's step loop sees it. Every call takes the coordinator's lock itself.
class RunHost {
 public:
  virtual ~RunHost() = default;
  // Whether the run is still to be trained: running, and the coordinator not stopping.
  virtual bool StillRunning(const std::string& run_id) = 0;
  // The step's exactly-once commit (the run store), then its metrics and the run's events. False
  // when the store refused it (the run is then failed).
  virtual bool CommitStep(const std::string& run_id, int64_t step, int64_t epoch,
                          const std::string& cursor, const v1::StepMetrics& metrics) = 0;
  // Ends a running run: done when `status` is OK, else paused or failed by the cause.
  virtual void EndRun(const Training& t, const absl::Status& status) = 0;
  // An evaluation during training started (shown on the run's status until it ends), and its
  // end: the result, when it has one, becomes the run's newest (status) and its metrics.
  virtual void EvaluationStarted(const std::string& run_id, const v1::EvalInProgress& e) = 0;
  virtual void EvaluationEnded(const std::string& run_id) = 0;
  virtual void RecordEval(const std::string& run_id, const v1::EvalResult& result) = 0;
  // A worker that did not answer a step's call: marked down.
  virtual void MarkDown(const std::string& worker_id, const std::string& why) = 0;
  // Releases every worker of the run: a failed call aborts its peers' channels, so that no peer
  // waits out its deadline for a partner that has given up.
  virtual void ReleaseWorkers(const Placement& p) = 0;
};

class RunDriver {
 public:
  RunDriver(RunHost* host, WorkerControl* workers, const Clock* clock,
            std::shared_ptr<Training> training);
  // Trains the run until it ends (done, failed, paused) or is no longer running (cancelled, the
  // coordinator stopping).
  void Run();

 private:
  // What one step's calls answered: per pair its target (rank 0) and its drafter, and the other
  // tensor-parallel ranks of each pair's target.
  struct PairResult {
    absl::StatusOr<v1::RunStepResponse> target, drafter;
  };
  struct TpRankResult {
    size_t pair = 0;
    absl::StatusOr<v1::RunStepResponse> result;
  };
  struct StepResults {
    std::vector<PairResult> pairs;
    std::vector<TpRankResult> tp_ranks;
  };

  // One step on every worker of the run; commits it. Returns false when the run must stop.
  bool RunOneStep();
  absl::StatusOr<std::unique_ptr<PlannedStep>> PlanStep();
  void Dispatch(PlannedStep* step, bool drafters);
  // Waits for the step's calls; once its targets are done, plans and dispatches the next step's
  // targets (run-ahead).
  StepResults AwaitStep(PlannedStep* cur);
  // The step's failure: the root cause among the calls (not a released peer's ABORTED), ranks of
  // a tensor-parallel target that disagree, a drafter that trained on other features than sent.
  static absl::Status CheckStepResults(const PlannedStep& cur, const StepResults& r);
  // eval.every_steps: has pair 0's target evaluate the snapshot `cur` exported, beside the next
  // steps (the host shows it on the run's status until it ends).
  void StartEvaluation(const PlannedStep& cur);
  // The running evaluation's end, waited for when `wait`, else taken only if it has ended: its
  // tau is committed with the next step; a failure is logged (it never stops training).
  void CollectEvaluation(bool wait);
  // Whether evaluations run between steps, not beside them: pair 0's target is a tensor-parallel
  // group on GPUs, whose decoding group and training group would otherwise run NCCL collectives
  // at once (docs/models.md). Then the step before an evaluation runs no target ahead either.
  bool EvaluatesBetweenSteps() const;
  // Who decodes the evaluations: the run's reserved group (eval.worker), else pair 0's target and
  // its tensor-parallel ranks.
  DecodeGroupWorkers EvaluationGroup() const;
  // Has pair 0's target decode with the drafter snapshot at `dir` (eval.*); records the result.
  absl::StatusOr<v1::EvalResult> Evaluate(const std::string& dir, int64_t step);
  // The step's figures, the host's commit, the log line, checkpoint pruning. False when the
  // commit was refused.
  bool CommitStep(const PlannedStep& cur, const StepResults& r);
  static v1::StepMetrics StepMetricsOf(const Training& t, const PlannedStep& cur,
                                       const StepResults& r,
                                       std::chrono::steady_clock::time_point now);

  RunHost* host_;
  WorkerControl* workers_;
  const Clock* clock_;
  std::shared_ptr<Training> t_;
};

}  // namespace dflash::coordinator

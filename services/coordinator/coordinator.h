// The coordinator's logic: runs, the worker registry, placement. The gRPC services in
// coordinator_service.h only adapt requests to these calls, so tests drive this class directly
// with a FakeClock and a fake WorkerControl.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/config/run_spec.h"
#include "common/metrics/catalogue.h"
#include "common/model/hf_config.h"
#include "common/transport/transport.h"
#include "dflash/v1/common.pb.h"
#include "dflash/v1/coordinator.pb.h"
#include "dflash/v1/registry.pb.h"
#include "services/coordinator/placement.h"
#include "services/coordinator/run_driver.h"
#include "services/coordinator/run_store.h"
#include "services/coordinator/worker_control.h"
#include "services/coordinator/worker_registry.h"

namespace dflash::plan {
struct RunPlan;
}  // namespace dflash::plan

namespace dflash::coordinator {

struct CoordinatorOptions {
  int64_t heartbeat_interval_ms = 1000;
  int64_t worker_timeout_ms = 10000;
  // Run directories live in <state_dir>/runs/<run id>/ (run.yaml, checkpoints/, export/).
  std::string state_dir;
  // Non-empty: run.yaml paths must lie inside these directories (config::RunSpecOptions).
  std::vector<std::string> data_roots;
  // Tests: drive a started run to its end inside Tick() instead of on a thread of its own.
  bool inline_steps = false;
};

class Coordinator : private RunHost {
 public:
  // Recovers runs from the store: a run that was starting or running when the previous
  // coordinator stopped is paused (its workers hold no state for it any more).
  // `metrics` may be null.
  ~Coordinator();  // stops and joins the runs' step threads (their runs pause on restart)
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const CoordinatorOptions& options,
                                                             std::unique_ptr<RunStore> store,
                                                             const Clock* clock,
                                                             WorkerControl* workers,
                                                             metrics::MetricsServer* metrics);

  // --- user API ---
  // Validates and resolves run.yaml; refuses a run whose memory plan fits none of the registered
  // GPUs of a role (naming the dominant term and a setting that fits); stores the run as queued
  // unless dry_run.
  absl::StatusOr<v1::RunStatus> SubmitRun(const std::string& run_yaml,
                                          const std::string& source_name, bool dry_run);
  // The memory plan of a run.yaml against the registered GPUs (placement.h, PlanTargetsOf).
  // `largest`: also the largest token budgets that fit the registered GPUs (plan::LargestTable).
  absl::StatusOr<v1::PlanRunResponse> PlanRun(const std::string& run_yaml, bool largest = false);
  // The acceptance length of a drafter (evaluation.h) on an idle target worker; blocks while it
  // decodes. FAILED_PRECONDITION when no target worker is idle.
  absl::StatusOr<v1::EvalResult> EvaluateDrafter(const v1::EvaluateDrafterRequest& req);
  // Regenerates a data set's answers with every idle target worker (regen.h); `progress` as there.
  absl::Status Regenerate(const v1::RegenerateRequest& req,
                          const std::function<bool(const v1::RegenerateProgress&)>& progress);
  absl::StatusOr<v1::RunStatus> GetRun(const std::string& run_id);
  absl::StatusOr<std::vector<v1::RunStatus>> ListRuns();
  absl::StatusOr<v1::RunStatus> CancelRun(const std::string& run_id);
  // Events with seq > after_seq. Blocks up to max_wait while there are none and the run is not
  // terminal; *terminal tells whether the run has ended and every event was returned.
  absl::StatusOr<std::vector<v1::RunEvent>> WaitForEvents(const std::string& run_id,
                                                          int64_t after_seq,
                                                          std::chrono::milliseconds max_wait,
                                                          bool* terminal);
  std::vector<v1::WorkerInfo> ListWorkers();

  // --- worker registry API ---
  absl::StatusOr<v1::RegisterResponse> Register(const v1::WorkerInfo& worker);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Periodic work: marks silent workers down (pausing their runs) and places queued runs on idle
  // pairs. Production calls it from a timer thread; tests call it after moving the fake clock.
  void Tick();

 private:
  Coordinator(const CoordinatorOptions& options, std::unique_ptr<RunStore> store,
              const Clock* clock, WorkerControl* workers, metrics::MetricsServer* metrics);
  absl::Status Recover();
  // Target workers that are up and hold no run: what eval and regen decode on (not reserved: a
  // run placed meanwhile shares them).
  std::vector<v1::WorkerInfo> IdleTargets();
  absl::Status TransitionLocked(const std::string& run_id, v1::RunState from, v1::RunState to,
                                const std::string& message,
                                const std::vector<std::string>* worker_ids = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a run placed on these pairs (and, when given, a target group reserved for its
  // evaluations, counted at the target's plan) must wait for GPU memory ("" when it fits;
  // placement.h FreeMemoryShortfall).
  std::string FreeMemoryWait(const config::RunSpec& spec,
                             const std::vector<std::vector<v1::WorkerInfo>>& groups,
                             const std::vector<v1::WorkerInfo>& drafters, size_t pairs,
                             const std::vector<v1::WorkerInfo>* eval_group = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PlanRun's "free now" part: each GPU's free memory against the plan of the workers a pair
  // would place on it, in the table, the JSON ("free_now") and `waits`.
  void AddFreeNow(const plan::RunPlan& p, v1::PlanRunResponse* resp, nlohmann::json* json);
  // SubmitRun: the run's memory plan against the largest registered GPU of each role.
  absl::Status CheckFitsRegisteredGpus(const config::RunSpec& spec,
                                       const model::TransformerConfig& target)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Placement> PlaceQueuedRunsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many pairs a queued run takes: placement.pairs, else a resumed run's earlier count, else
  // every idle pair (GPU drafters: one per GPU).
  size_t PairsWantedLocked(const std::string& run_id, const config::RunSpec& spec,
                           const std::vector<v1::WorkerInfo>& drafters, size_t available)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the first `wanted` pairs as the run's (and with reserve_eval_group the next target group,
  // for its evaluations) and moves it to starting; nullopt (workers freed) when the transition is
  // refused.
  std::optional<Placement> AssignLocked(const v1::RunStatus& run,
                                        const std::vector<std::vector<v1::WorkerInfo>>& groups,
                                        const std::vector<v1::WorkerInfo>& drafters, size_t wanted,
                                        bool reserve_eval_group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RequeuePausedRunsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // run_start.cc: prepares the workers, then has a RunDriver (run_driver.h) train the run to its
  // end (or until it is cancelled, paused or fails); on its own thread unless
  // options_.inline_steps.
  void StartRun(const Placement& placement);
  // What preparing a placed run's pairs gathers (pair_prepare.cc).
  struct Preparation {
    absl::Status status;
    std::string failed_worker;                     // the worker whose PrepareRun failed
    std::vector<std::string> echoes;               // "<worker> applied N settings"
    std::map<std::string, int64_t> planned_peaks;  // role -> the memory plan's allocator peak
    std::string group_prefix;                      // names this attempt's channels and groups
    std::string nccl_unique_id;                    // from the pair-0 drafter of an nccl group
  };
  // What a pair's target hands its drafter and its other ranks.
  struct PairIds {
    std::string channel_descriptor;  // transport nccl: from the target, for its drafter
    std::string tp_unique_id;        // nccl tensor-parallel group: from the target's rank 0
  };
  // pair_prepare.cc: pair i's transport, memory check and PrepareRun on each of its workers.
  void PreparePair(const Placement& p, size_t i, const Training& t, Preparation* prep);
  static absl::Status CheckPairMemory(const Placement& p, size_t i, const Training& t,
                                      const model::TransformerConfig& tc,
                                      transport::Transport transport);
  static v1::PrepareRunRequest PrepareRequest(const Placement& p, size_t i, const Training& t,
                                              transport::Transport transport,
                                              const Preparation& prep, int64_t tp_rank,
                                              int64_t tp_world, const PairIds& ids);
  // After the pairs' preparation: the run moves to running (its step thread started unless
  // inline_steps), back to queued (a worker unreachable) or to failed. True: it trains.
  bool ConcludeStart(const Placement& p, const std::shared_ptr<Training>& training,
                     const Preparation& prep);
  absl::Status SetUpTraining(const Placement& p, Training* t);
  // The run's directory: checkpoints/, export/, logs/ (its log opened), eval/, run.yaml.
  absl::Status MakeRunDir(const Placement& p, Training* t);
  // The newest checkpoint of a committed step (resume_from), the data cursor after it, the batcher
  // from there and the step to train next.
  absl::Status FindResumePoint(const Placement& p, Training* t);
  // The run's step loop (RunDriver) on the calling thread, then its workers released.
  void DriveRun(std::shared_ptr<Training> t);
  // RunHost (run_driver.h), for the step loops: run_start.cc, and step_commit.cc's CommitStep.
  bool StillRunning(const std::string& run_id) override ABSL_LOCKS_EXCLUDED(mu_);
  bool CommitStep(const std::string& run_id, int64_t step, int64_t epoch, const std::string& cursor,
                  const v1::StepMetrics& metrics) override ABSL_LOCKS_EXCLUDED(mu_);
  void EndRun(const Training& t, const absl::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);
  void EvaluationStarted(const std::string& run_id, const v1::EvalInProgress& e) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void EvaluationEnded(const std::string& run_id) override ABSL_LOCKS_EXCLUDED(mu_);
  void RecordEval(const std::string& run_id, const v1::EvalResult& result) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void MarkDown(const std::string& worker_id, const std::string& why) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseWorkers(const Placement& p) override ABSL_LOCKS_EXCLUDED(mu_);
  void ExportStepMetricsLocked(const std::string& run_id, int64_t epoch, const v1::StepMetrics& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string RunDir(const std::string& run_id) const;
  void FillProgressLocked(v1::RunStatus* run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const Clock* clock_;
  WorkerControl* workers_;
  metrics::MetricsServer* metrics_;

  // One mutex for the run store, the registry and the run bookkeeping: the tick, the RPC
  // handlers and the step threads take it (clang's -Wthread-safety checks the annotations:
  // scripts/check-thread-safety.sh).
  absl::Mutex mu_;
  absl::CondVar events_cv_;  // signalled on every run transition
  std::unique_ptr<RunStore> store_ ABSL_PT_GUARDED_BY(mu_);
  WorkerRegistry registry_ ABSL_GUARDED_BY(mu_);
  uint64_t attempts_ ABSL_GUARDED_BY(mu_) = 0;  // numbers each start of a run (channel names)
  std::map<std::string, std::thread> drivers_ ABSL_GUARDED_BY(mu_);  // run id -> its step thread
  // run id -> its newest evaluation
  std::map<std::string, v1::EvalResult> last_evals_ ABSL_GUARDED_BY(mu_);
  // run id -> the evaluation running beside its steps
  std::map<std::string, v1::EvalInProgress> evaluating_ ABSL_GUARDED_BY(mu_);
  // run id -> the step at which it was last paused for running out of memory (EndRun): a second
  // time at the same step fails the run instead of pausing it again.
  std::map<std::string, int64_t> oom_paused_at_ ABSL_GUARDED_BY(mu_);
  // Runs whose preparation ran out of memory once (queued again); a second time fails them.
  std::set<std::string> oom_prepare_failed_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dflash::coordinator

// The coordinator's logic: runs, the worker registry, placement. The gRPC services in
// coordinator_service.h only adapt requests to these calls, so tests drive this class directly
// with a FakeClock and a fake WorkerControl.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/metrics/catalogue.h"
#include "dflash/v1/common.pb.h"
#include "dflash/v1/registry.pb.h"
#include "services/coordinator/run_store.h"
#include "services/coordinator/worker_control.h"
#include "services/coordinator/worker_registry.h"

namespace dflash::coordinator {

struct CoordinatorOptions {
  int64_t heartbeat_interval_ms = 1000;
  int64_t worker_timeout_ms = 10000;
};

class Coordinator {
 public:
  // Recovers runs from the store: a run that was starting or running when the previous
  // coordinator stopped is paused (its workers hold no state for it any more).
  // `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const CoordinatorOptions& options,
                                                             std::unique_ptr<RunStore> store,
                                                             const Clock* clock,
                                                             WorkerControl* workers,
                                                             metrics::MetricsServer* metrics);

  // --- user API ---
  // Validates and resolves run.yaml; stores the run as queued unless dry_run.
  absl::StatusOr<v1::RunStatus> SubmitRun(const std::string& run_yaml,
                                          const std::string& source_name, bool dry_run);
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
  struct Placement {
    std::string run_id;
    std::string resolved_yaml;
    std::vector<std::pair<v1::WorkerInfo, v1::WorkerInfo>> pairs;  // (target, drafter)
  };

  Coordinator(const CoordinatorOptions& options, std::unique_ptr<RunStore> store,
              const Clock* clock, WorkerControl* workers, metrics::MetricsServer* metrics);
  absl::Status Recover();
  absl::Status TransitionLocked(const std::string& run_id, v1::RunState from, v1::RunState to,
                                const std::string& message,
                                const std::vector<std::string>* worker_ids = nullptr);
  std::vector<Placement> PlaceQueuedRunsLocked();
  void StartRun(const Placement& placement);
  void UpdateGaugesLocked();

  const CoordinatorOptions options_;
  const Clock* clock_;
  WorkerControl* workers_;
  metrics::MetricsServer* metrics_;

  std::mutex mu_;
  std::condition_variable events_cv_;  // notified on every run transition
  std::unique_ptr<RunStore> store_;
  WorkerRegistry registry_;
};

}  // namespace dflash::coordinator

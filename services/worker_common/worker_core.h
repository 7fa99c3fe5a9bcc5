// State and control logic shared by target and drafter workers: the run a worker holds, the
// settings it applies, and the registration/heartbeat loop with the coordinator.
#pragma once

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/config/process_config.h"
#include "common/config/run_spec.h"
#include "common/metrics/catalogue.h"
#include "dflash/v1/registry.grpc.pb.h"
#include "dflash/v1/worker.pb.h"
#include "services/worker_common/evaluator.h"
#include "services/worker_common/step_runner.h"

namespace dflash::worker {

class WorkerCore {
 public:
  // `runners` makes the role-specific half (step_runner.h) for each run the worker prepares.
  WorkerCore(v1::WorkerInfo self, StepRunnerFactory runners, metrics::MetricsServer* metrics);

  // Control RPCs (called by the gRPC adapter).
  absl::StatusOr<v1::PrepareRunResponse> PrepareRun(const v1::PrepareRunRequest& req);
  absl::Status ReleaseRun(const std::string& run_id);
  absl::StatusOr<v1::RunStepResponse> RunStep(const v1::RunStepRequest& req);
  v1::WorkerStatusResponse Status();
  // Target workers: the acceptance length of a drafter snapshot by speculative decoding
  // (evaluator.h). UNIMPLEMENTED where no evaluator was set (drafter workers).
  absl::StatusOr<v1::EvaluateResponse> Evaluate(const v1::EvaluateRequest& req);
  // Target workers: plain generation (dflashctl regen).
  absl::StatusOr<v1::GenerateResponse> Generate(const v1::GenerateRequest& req);
  // Target workers: rank 0 of a tensor-parallel decoding group on NCCL makes its unique id.
  absl::StatusOr<v1::OpenDecodeGroupResponse> OpenDecodeGroup(
      const v1::OpenDecodeGroupRequest& req);
  void SetEvaluator(std::unique_ptr<Evaluator> evaluator) { evaluator_ = std::move(evaluator); }
  // Steps of each run that run under the kernel profiler (worker config `profile_steps`); set
  // before serving.
  void SetProfileSteps(config::ProfileSteps steps) { profile_steps_ = steps; }

  // Coordinator says which run this worker holds (heartbeat reply); drops any other.
  void ReconcileAssignment(const std::string& assigned_run_id);

  void SetWorkerId(const std::string& id);
  void SetControlAddress(const std::string& address);
  v1::WorkerInfo Info();
  // Fresh device reading, also pushed to the metrics.
  v1::DeviceInfo ReadDevice();

 private:
  void UpdateStepMetrics(const StepReport& report);
  // runner->RunStep(work), under the kernel profiler when profile_steps_ covers the step: then
  // it waits for the device at the end and logs the step's wall and device time by category.
  absl::StatusOr<StepReport> RunStepProfiled(StepRunner& runner, const StepWork& work, int gpu,
                                             const std::string& run_id);
  // The request's decoding group, checked (INVALID_ARGUMENT naming the group field).
  static absl::StatusOr<DecodeGroupWork> GroupOf(const v1::DecodeGroup& g);
  int Gpu();  // this worker's device, -1 for the CPU

  std::mutex mu_;
  v1::WorkerInfo self_;
  StepRunnerFactory runners_;
  metrics::MetricsServer* metrics_;
  std::string run_id_;
  std::string transport_;  // the held run's feature transport (metrics label)
  int64_t step_ = 0;
  // The allocator's peak over the process's life: its peak is reset at every step (for the
  // per-step peak), so the peak before the first reset (loading the models) is kept here.
  uint64_t process_peak_ = 0;
  // The held run's runner; shared so that ReleaseRun can abort a step still using it.
  std::shared_ptr<StepRunner> runner_;
  std::mutex step_mu_;                    // one step at a time
  std::unique_ptr<Evaluator> evaluator_;  // set before serving; serializes its own calls
  config::ProfileSteps profile_steps_;    // set before serving
};

// Registers with the coordinator (retrying with backoff until it answers) and heartbeats every
// interval on its own thread; re-registers when the coordinator forgot it (restart).
class CoordinatorLink {
 public:
  // `creds`: how the coordinator is dialed (null = plaintext).
  CoordinatorLink(const std::string& coordinator_address, WorkerCore* core,
                  metrics::MetricsServer* metrics,
                  std::shared_ptr<grpc::ChannelCredentials> creds = nullptr);
  ~CoordinatorLink();
  void Start();
  void Stop();

 private:
  void Loop();
  bool RegisterOnce();
  // Sleeps up to `ms` unless stopped; returns false when stopping.
  bool WaitMs(int64_t ms);

  std::string address_;
  WorkerCore* core_;
  metrics::MetricsServer* metrics_;
  std::unique_ptr<v1::Registry::Stub> stub_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string worker_id_;
  int64_t interval_ms_ = 1000;
};

}  // namespace dflash::worker

// How the coordinator talks to a worker's control service. An interface so that the coordinator's
// logic is tested with a fake (tests/unit/fake_worker_control.h) and run with gRPC.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dflash/v1/common.pb.h"
#include "dflash/v1/worker.pb.h"

namespace grpc {
class ChannelCredentials;
class ClientContext;
}  // namespace grpc

namespace dflash::coordinator {

class WorkerControl {
 public:
  virtual ~WorkerControl() = default;
  virtual absl::StatusOr<v1::PrepareRunResponse> PrepareRun(const v1::WorkerInfo& worker,
                                                            const v1::PrepareRunRequest& req) = 0;
  virtual absl::Status ReleaseRun(const v1::WorkerInfo& worker, const std::string& run_id) = 0;
  // One training step; may take long (its deadline is the step's, not the control deadline).
  virtual absl::StatusOr<v1::RunStepResponse> RunStep(const v1::WorkerInfo& worker,
                                                      const v1::RunStepRequest& req) = 0;
  // Target workers: speculative decoding with a drafter snapshot (long: its own deadline).
  virtual absl::StatusOr<v1::EvaluateResponse> Evaluate(const v1::WorkerInfo& worker,
                                                        const v1::EvaluateRequest& req) = 0;
  virtual absl::StatusOr<v1::GenerateResponse> Generate(const v1::WorkerInfo& worker,
                                                        const v1::GenerateRequest& req) = 0;
  // Target workers: rank 0 of a tensor-parallel decoding group on NCCL makes its unique id.
  virtual absl::StatusOr<v1::OpenDecodeGroupResponse> OpenDecodeGroup(
      const v1::WorkerInfo& worker, const v1::OpenDecodeGroupRequest& req) {
    return absl::UnimplementedError("OpenDecodeGroup");
  }
  // Ends every call in flight to this worker now, with UNAVAILABLE: the coordinator marked it
  // down (a hung process keeps its connections open, so its calls would otherwise wait out their
  // deadlines, up to 30 minutes for a step).
  virtual void CancelCalls(const v1::WorkerInfo& worker) {}
};

// gRPC implementation; one channel per worker address, every call with a deadline.
class GrpcWorkerControl : public WorkerControl {
 public:
  // `creds`: how workers' control ports are dialed (null = plaintext).
  explicit GrpcWorkerControl(int64_t rpc_timeout_ms,
                             std::shared_ptr<grpc::ChannelCredentials> creds = nullptr);
  ~GrpcWorkerControl() override;
  absl::StatusOr<v1::PrepareRunResponse> PrepareRun(const v1::WorkerInfo& worker,
                                                    const v1::PrepareRunRequest& req) override;
  absl::Status ReleaseRun(const v1::WorkerInfo& worker, const std::string& run_id) override;
  absl::StatusOr<v1::RunStepResponse> RunStep(const v1::WorkerInfo& worker,
                                              const v1::RunStepRequest& req) override;
  absl::StatusOr<v1::EvaluateResponse> Evaluate(const v1::WorkerInfo& worker,
                                                const v1::EvaluateRequest& req) override;
  absl::StatusOr<v1::GenerateResponse> Generate(const v1::WorkerInfo& worker,
                                                const v1::GenerateRequest& req) override;
  absl::StatusOr<v1::OpenDecodeGroupResponse> OpenDecodeGroup(
      const v1::WorkerInfo& worker, const v1::OpenDecodeGroupRequest& req) override;
  void CancelCalls(const v1::WorkerInfo& worker) override;

 private:
  struct Stubs;
  class InFlight;
  Stubs* GetStubs(const std::string& address);

  int64_t rpc_timeout_ms_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Stubs>> stubs_ ABSL_GUARDED_BY(mu_);
  // Calls in flight by worker address (their contexts), and the addresses whose calls were
  // cancelled since each call started.
  std::multimap<std::string, grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dflash::coordinator

#include "services/coordinator/worker_control.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/rpc/channel.h"
#include "common/rpc/grpc_status.h"
#include "dflash/v1/worker.grpc.pb.h"

namespace dflash::coordinator {

struct GrpcWorkerControl::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::TargetWorker::Stub> target;
  std::unique_ptr<v1::DrafterWorker::Stub> drafter;
};

GrpcWorkerControl::GrpcWorkerControl(int64_t rpc_timeout_ms,
                                     std::shared_ptr<grpc::ChannelCredentials> creds)
    : rpc_timeout_ms_(rpc_timeout_ms), creds_(std::move(creds)) {}
GrpcWorkerControl::~GrpcWorkerControl() = default;

GrpcWorkerControl::Stubs* GrpcWorkerControl::GetStubs(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& slot = stubs_[address];
  if (!slot) {
    slot = std::make_unique<Stubs>();
    slot->channel = MakeChannel(address, creds_);
    slot->target = v1::TargetWorker::NewStub(slot->channel);
    slot->drafter = v1::DrafterWorker::NewStub(slot->channel);
  }
  return slot.get();
}

namespace {

void SetDeadline(grpc::ClientContext* ctx, int64_t timeout_ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

absl::Status Annotated(const grpc::Status& s, const v1::WorkerInfo& w, const char* rpc) {
  // CANCELLED comes only from CancelCalls (the worker was marked down): the worker is unreachable.
  absl::Status status = s.error_code() == grpc::StatusCode::CANCELLED
                            ? absl::UnavailableError("worker marked down; call abandoned")
                            : FromGrpcStatus(s);
  return Annotate(status, absl::StrCat(rpc, " on worker ", w.worker_id(), " (", w.name(), ")"));
}

}  // namespace

// Registers a call's context for CancelCalls for the call's lifetime.
class GrpcWorkerControl::InFlight {
 public:
  InFlight(GrpcWorkerControl* c, const std::string& address, grpc::ClientContext* ctx) : c_(c) {
    absl::MutexLock lock(&c_->mu_);
    it_ = c_->in_flight_.emplace(address, ctx);
  }
  ~InFlight() {
    absl::MutexLock lock(&c_->mu_);
    c_->in_flight_.erase(it_);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  GrpcWorkerControl* c_;
  std::multimap<std::string, grpc::ClientContext*>::iterator it_;
};

void GrpcWorkerControl::CancelCalls(const v1::WorkerInfo& worker) {
  absl::MutexLock lock(&mu_);
  auto [begin, end] = in_flight_.equal_range(worker.control_address());
  for (auto it = begin; it != end; ++it) it->second->TryCancel();
}

absl::StatusOr<v1::PrepareRunResponse> GrpcWorkerControl::PrepareRun(
    const v1::WorkerInfo& worker, const v1::PrepareRunRequest& req) {
  Stubs* stubs = GetStubs(worker.control_address());
  grpc::ClientContext ctx;
  InFlight in_flight(this, worker.control_address(), &ctx);
  // Preparing loads the models (a large checkpoint takes minutes from disk): not a control-call
  // deadline, or a slow load would look like a dead worker and requeue the run forever.
  constexpr int64_t kPrepareDeadlineMs = 20 * 60 * 1000;
  SetDeadline(&ctx, std::max(rpc_timeout_ms_, kPrepareDeadlineMs));
  v1::PrepareRunResponse resp;
  grpc::Status s = worker.role() == v1::WORKER_ROLE_TARGET
                       ? stubs->target->PrepareRun(&ctx, req, &resp)
                       : stubs->drafter->PrepareRun(&ctx, req, &resp);
  if (!s.ok()) return Annotated(s, worker, "PrepareRun");
  return resp;
}

absl::Status GrpcWorkerControl::ReleaseRun(const v1::WorkerInfo& worker,
                                           const std::string& run_id) {
  Stubs* stubs = GetStubs(worker.control_address());
  grpc::ClientContext ctx;
  InFlight in_flight(this, worker.control_address(), &ctx);
  // Release is best effort (a worker also drops a run its heartbeat reply no longer names), so a
  // dead worker must not hold the caller for the full control deadline.
  SetDeadline(&ctx, std::min<int64_t>(rpc_timeout_ms_, 2000));
  v1::ReleaseRunRequest req;
  req.set_run_id(run_id);
  v1::ReleaseRunResponse resp;
  grpc::Status s = worker.role() == v1::WORKER_ROLE_TARGET
                       ? stubs->target->ReleaseRun(&ctx, req, &resp)
                       : stubs->drafter->ReleaseRun(&ctx, req, &resp);
  if (!s.ok()) return Annotated(s, worker, "ReleaseRun");
  return absl::OkStatus();
}

absl::StatusOr<v1::RunStepResponse> GrpcWorkerControl::RunStep(const v1::WorkerInfo& worker,
                                                               const v1::RunStepRequest& req) {
  // A step ends well before this: each side gives up on its feature channel after 10 minutes
  // (services/worker_common/channel_limits.h) and answers with the error.
  constexpr int64_t kStepDeadlineMs = 30 * 60 * 1000;
  Stubs* stubs = GetStubs(worker.control_address());
  grpc::ClientContext ctx;
  InFlight in_flight(this, worker.control_address(), &ctx);
  SetDeadline(&ctx, kStepDeadlineMs);
  v1::RunStepResponse resp;
  grpc::Status s = worker.role() == v1::WORKER_ROLE_TARGET
                       ? stubs->target->RunStep(&ctx, req, &resp)
                       : stubs->drafter->RunStep(&ctx, req, &resp);
  if (!s.ok()) return Annotated(s, worker, "RunStep");
  return resp;
}

absl::StatusOr<v1::EvaluateResponse> GrpcWorkerControl::Evaluate(const v1::WorkerInfo& worker,
                                                                 const v1::EvaluateRequest& req) {
  constexpr int64_t kEvalDeadlineMs = 60 * 60 * 1000;  // decoding many prompts takes a while
  if (worker.role() != v1::WORKER_ROLE_TARGET) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker.name(), " is not a target"));
  }
  Stubs* stubs = GetStubs(worker.control_address());
  grpc::ClientContext ctx;
  InFlight in_flight(this, worker.control_address(), &ctx);
  SetDeadline(&ctx, kEvalDeadlineMs);
  v1::EvaluateResponse resp;
  grpc::Status s = stubs->target->Evaluate(&ctx, req, &resp);
  if (!s.ok()) return Annotated(s, worker, "Evaluate");
  return resp;
}

absl::StatusOr<v1::GenerateResponse> GrpcWorkerControl::Generate(const v1::WorkerInfo& worker,
                                                                 const v1::GenerateRequest& req) {
  constexpr int64_t kGenerateDeadlineMs = 60 * 60 * 1000;
  if (worker.role() != v1::WORKER_ROLE_TARGET) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker.name(), " is not a target"));
  }
  Stubs* stubs = GetStubs(worker.control_address());
  grpc::ClientContext ctx;
  InFlight in_flight(this, worker.control_address(), &ctx);
  SetDeadline(&ctx, kGenerateDeadlineMs);
  v1::GenerateResponse resp;
  grpc::Status s = stubs->target->Generate(&ctx, req, &resp);
  if (!s.ok()) return Annotated(s, worker, "Generate");
  return resp;
}

absl::StatusOr<v1::OpenDecodeGroupResponse> GrpcWorkerControl::OpenDecodeGroup(
    const v1::WorkerInfo& worker, const v1::OpenDecodeGroupRequest& req) {
  if (worker.role() != v1::WORKER_ROLE_TARGET) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker.name(), " is not a target"));
  }
  Stubs* stubs = GetStubs(worker.control_address());
  grpc::ClientContext ctx;
  InFlight in_flight(this, worker.control_address(), &ctx);
  SetDeadline(&ctx, rpc_timeout_ms_);
  v1::OpenDecodeGroupResponse resp;
  grpc::Status s = stubs->target->OpenDecodeGroup(&ctx, req, &resp);
  if (!s.ok()) return Annotated(s, worker, "OpenDecodeGroup");
  return resp;
}

}  // namespace dflash::coordinator

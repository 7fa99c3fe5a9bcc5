// gRPC adapter of a worker's control service. TargetWorker and DrafterWorker share the control
// RPCs, so one template adapts either generated base class to a WorkerCore. Every handler runs
// under Guarded (common/rpc/guarded.h): no exception leaves it.
#pragma once

#include "common/rpc/grpc_status.h"
#include "common/rpc/guarded.h"
#include "dflash/v1/worker.grpc.pb.h"
#include "services/worker_common/worker_core.h"

namespace dflash::worker {

template <typename ServiceBase>
class WorkerControlService : public ServiceBase {
 public:
  explicit WorkerControlService(WorkerCore* core) : core_(core) {}

  grpc::Status GetStatus(grpc::ServerContext*, const v1::WorkerStatusRequest*,
                         v1::WorkerStatusResponse* resp) override {
    return Guarded("GetStatus", [&] {
      *resp = core_->Status();
      return grpc::Status::OK;
    });
  }
  grpc::Status PrepareRun(grpc::ServerContext*, const v1::PrepareRunRequest* req,
                          v1::PrepareRunResponse* resp) override {
    return Guarded("PrepareRun", [&] {
      auto r = core_->PrepareRun(*req);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *resp = *std::move(r);
      return grpc::Status::OK;
    });
  }
  grpc::Status ReleaseRun(grpc::ServerContext*, const v1::ReleaseRunRequest* req,
                          v1::ReleaseRunResponse*) override {
    return Guarded("ReleaseRun", [&] { return ToGrpcStatus(core_->ReleaseRun(req->run_id())); });
  }
  grpc::Status RunStep(grpc::ServerContext*, const v1::RunStepRequest* req,
                       v1::RunStepResponse* resp) override {
    return Guarded("RunStep", [&] {
      auto r = core_->RunStep(*req);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *resp = *std::move(r);
      return grpc::Status::OK;
    });
  }

 protected:
  WorkerCore* core_;
};

// The target worker's service: the control RPCs and Evaluate.
class TargetWorkerService final : public WorkerControlService<v1::TargetWorker::Service> {
 public:
  explicit TargetWorkerService(WorkerCore* core) : WorkerControlService(core) {}
  grpc::Status Evaluate(grpc::ServerContext*, const v1::EvaluateRequest* req,
                        v1::EvaluateResponse* resp) override {
    return Guarded("Evaluate", [&] {
      auto r = core_->Evaluate(*req);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *resp = *std::move(r);
      return grpc::Status::OK;
    });
  }
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override {
    return Guarded("Generate", [&] {
      auto r = core_->Generate(*req);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *resp = *std::move(r);
      return grpc::Status::OK;
    });
  }
  grpc::Status OpenDecodeGroup(grpc::ServerContext*, const v1::OpenDecodeGroupRequest* req,
                               v1::OpenDecodeGroupResponse* resp) override {
    return Guarded("OpenDecodeGroup", [&] {
      auto r = core_->OpenDecodeGroup(*req);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *resp = *std::move(r);
      return grpc::Status::OK;
    });
  }
};

}  // namespace dflash::worker

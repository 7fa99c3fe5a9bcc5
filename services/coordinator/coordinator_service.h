// gRPC front ends of the coordinator: they turn requests into Coordinator calls and Status into
// grpc::Status, nothing more.
#pragma once

#include <string>
#include <utility>

#include "dflash/v1/coordinator.grpc.pb.h"
#include "dflash/v1/registry.grpc.pb.h"
#include "services/coordinator/coordinator.h"

namespace dflash::coordinator {

// `token` non-empty: every call must carry the metadata "authorization: Bearer <token>"
// (dflashctl --token_file), else UNAUTHENTICATED.
class CoordinatorService final : public v1::Coordinator::Service {
 public:
  explicit CoordinatorService(Coordinator* c, std::string token = "")
      : c_(c), token_(std::move(token)) {}
  grpc::Status SubmitRun(grpc::ServerContext*, const v1::SubmitRunRequest*,
                         v1::SubmitRunResponse*) override;
  grpc::Status GetRun(grpc::ServerContext*, const v1::GetRunRequest*, v1::GetRunResponse*) override;
  grpc::Status ListRuns(grpc::ServerContext*, const v1::ListRunsRequest*,
                        v1::ListRunsResponse*) override;
  grpc::Status CancelRun(grpc::ServerContext*, const v1::CancelRunRequest*,
                         v1::CancelRunResponse*) override;
  grpc::Status WatchRun(grpc::ServerContext*, const v1::WatchRunRequest*,
                        grpc::ServerWriter<v1::RunEvent>*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse*) override;
  grpc::Status PlanRun(grpc::ServerContext*, const v1::PlanRunRequest*,
                       v1::PlanRunResponse*) override;
  grpc::Status EvaluateDrafter(grpc::ServerContext*, const v1::EvaluateDrafterRequest*,
                               v1::EvaluateDrafterResponse*) override;
  grpc::Status Regenerate(grpc::ServerContext*, const v1::RegenerateRequest*,
                          grpc::ServerWriter<v1::RegenerateProgress>*) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext* ctx) const;

  Coordinator* c_;
  std::string token_;
};

class RegistryService final : public v1::Registry::Service {
 public:
  // require_client_cert (tls.mutual): calls without a verified client certificate are refused.
  RegistryService(Coordinator* c, bool require_client_cert)
      : c_(c), require_client_cert_(require_client_cert) {}
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*,
                        v1::RegisterResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext* ctx) const;

  Coordinator* c_;
  bool require_client_cert_;
};

}  // namespace dflash::coordinator

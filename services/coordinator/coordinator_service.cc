#include "services/coordinator/coordinator_service.h"

#include "common/rpc/grpc_status.h"
#include "common/rpc/guarded.h"
#include "common/rpc/tls.h"

namespace dflash::coordinator {

grpc::Status CoordinatorService::Authorize(const grpc::ServerContext* ctx) const {
  if (token_.empty()) return grpc::Status::OK;
  const std::string want = "Bearer " + token_;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  bool ok = it != md.end() && it->second.size() == want.size();
  if (ok) {  // compared in constant time
    unsigned char diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff |= static_cast<unsigned char>(it->second.data()[i] ^ want[i]);
    }
    ok = diff == 0;
  }
  if (ok) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      it == md.end() ? "this coordinator requires a bearer token (dflashctl "
                                       "--token_file FILE, or DFLASH_TOKEN_FILE)"
                                     : "the bearer token is not this coordinator's");
}

grpc::Status CoordinatorService::SubmitRun(grpc::ServerContext* ctx,
                                           const v1::SubmitRunRequest* req,
                                           v1::SubmitRunResponse* resp) {
  return Guarded("SubmitRun", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto run = c_->SubmitRun(req->run_yaml(), req->source_name(), req->dry_run());
    if (!run.ok()) return ToGrpcStatus(run.status());
    *resp->mutable_run() = *std::move(run);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::GetRun(grpc::ServerContext* ctx, const v1::GetRunRequest* req,
                                        v1::GetRunResponse* resp) {
  return Guarded("GetRun", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto run = c_->GetRun(req->run_id());
    if (!run.ok()) return ToGrpcStatus(run.status());
    *resp->mutable_run() = *std::move(run);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::ListRuns(grpc::ServerContext* ctx, const v1::ListRunsRequest*,
                                          v1::ListRunsResponse* resp) {
  return Guarded("ListRuns", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto runs = c_->ListRuns();
    if (!runs.ok()) return ToGrpcStatus(runs.status());
    for (auto& r : *runs) *resp->add_runs() = std::move(r);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::CancelRun(grpc::ServerContext* ctx,
                                           const v1::CancelRunRequest* req,
                                           v1::CancelRunResponse* resp) {
  return Guarded("CancelRun", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto run = c_->CancelRun(req->run_id());
    if (!run.ok()) return ToGrpcStatus(run.status());
    *resp->mutable_run() = *std::move(run);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::WatchRun(grpc::ServerContext* ctx, const v1::WatchRunRequest* req,
                                          grpc::ServerWriter<v1::RunEvent>* writer) {
  return Guarded("WatchRun", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    int64_t after = req->after_seq();
    int64_t progress_sent = -1;  // newest committed step sent as a progress event
    // Wakes at least every 500 ms to notice a client that went away and to send progress.
    constexpr std::chrono::milliseconds kPoll{500};
    while (!ctx->IsCancelled()) {
      bool terminal = false;
      auto events = c_->WaitForEvents(req->run_id(), after, kPoll, &terminal);
      if (!events.ok()) return ToGrpcStatus(events.status());
      for (const auto& e : *events) {
        if (!writer->Write(e)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
        after = e.seq();
      }
      // Progress: the newest committed step, as an event that carries no transition (its seq is
      // the last transition's, so a resumed watch does not skip anything).
      auto run = c_->GetRun(req->run_id());
      if (run.ok() && run->has_last_step() && run->last_step().step() > progress_sent &&
          run->state() == v1::RUN_STATE_RUNNING) {
        v1::RunEvent p;
        p.set_seq(after);
        p.set_run_id(run->run_id());
        p.set_from_state(run->state());
        p.set_to_state(run->state());
        p.set_step(run->step());
        *p.mutable_progress() = run->last_step();
        // The newest evaluation's tau rides on every progress event (evaluations are rare steps
        // that a polling watch may not see as the newest).
        if (p.progress().measured_acceptance_length() == 0 && run->has_last_eval()) {
          p.mutable_progress()->set_measured_acceptance_length(run->last_eval().tau());
        }
        p.set_total_steps(run->total_steps());
        if (!writer->Write(p)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
        progress_sent = run->last_step().step();
      }
      if (terminal && events->empty()) return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the watch");
  });
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext* ctx,
                                             const v1::ListWorkersRequest*,
                                             v1::ListWorkersResponse* resp) {
  return Guarded("ListWorkers", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    for (auto& w : c_->ListWorkers()) *resp->add_workers() = std::move(w);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::PlanRun(grpc::ServerContext* ctx, const v1::PlanRunRequest* req,
                                         v1::PlanRunResponse* resp) {
  return Guarded("PlanRun", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto r = c_->PlanRun(req->run_yaml(), req->largest());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::EvaluateDrafter(grpc::ServerContext* ctx,
                                                 const v1::EvaluateDrafterRequest* req,
                                                 v1::EvaluateDrafterResponse* resp) {
  return Guarded("EvaluateDrafter", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto r = c_->EvaluateDrafter(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp->mutable_result() = *std::move(r);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::Regenerate(grpc::ServerContext* ctx,
                                            const v1::RegenerateRequest* req,
                                            grpc::ServerWriter<v1::RegenerateProgress>* writer) {
  return Guarded("Regenerate", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    absl::Status s = c_->Regenerate(*req, [&](const v1::RegenerateProgress& p) {
      return !ctx->IsCancelled() && writer->Write(p);
    });
    return ToGrpcStatus(s);
  });
}

grpc::Status RegistryService::Authorize(const grpc::ServerContext* ctx) const {
  if (!require_client_cert_ || PeerHasVerifiedCertificate(*ctx)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this coordinator requires workers to present a TLS client certificate "
                      "signed by its tls.ca_file (tls.mutual); configure the worker's "
                      "tls.cert_file and tls.key_file");
}

grpc::Status RegistryService::Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                                       v1::RegisterResponse* resp) {
  return Guarded("Register", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto r = c_->Register(req->worker());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  });
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                        v1::HeartbeatResponse* resp) {
  return Guarded("Heartbeat", [&]() -> grpc::Status {
    if (grpc::Status a = Authorize(ctx); !a.ok()) return a;
    auto r = c_->Heartbeat(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  });
}

}  // namespace dflash::coordinator

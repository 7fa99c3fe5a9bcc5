// A WorkerControl that records calls and answers from a script, for coordinator tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "common/config/run_spec.h"
#include "common/run/resolve.h"
#include "services/coordinator/settings_echo.h"
#include "services/coordinator/worker_control.h"

namespace dflash::coordinator {

class FakeWorkerControl : public WorkerControl {
 public:
  absl::StatusOr<v1::PrepareRunResponse> PrepareRun(const v1::WorkerInfo& worker,
                                                    const v1::PrepareRunRequest& req) override {
    if (on_prepare) on_prepare(worker);
    std::lock_guard<std::mutex> lock(mu_);
    prepared.push_back(worker.worker_id() + ":" + req.run_id());
    prepare_requests.push_back(req);
    auto it = prepare_errors.find(worker.worker_id());
    if (it != prepare_errors.end()) return it->second;
    v1::PrepareRunResponse resp;
    for (const auto& [k, v] : Echo(req, worker.role() == v1::WORKER_ROLE_DRAFTER)) {
      (*resp.mutable_applied())[k] = v;
    }
    for (const auto& [k, v] : echo_overrides) (*resp.mutable_applied())[k] = v;
    for (const std::string& k : echo_omit) resp.mutable_applied()->erase(k);
    resp.set_kernel_overrides(kernel_overrides);
    // The pair-0 drafter of an nccl group makes the group's unique id.
    if (req.collective() == "nccl" && req.pair() == 0)
      resp.set_nccl_unique_id("id-" + req.run_id());
    // A target on transport nccl makes its pair's channel descriptor (the drafter has a peer).
    if (req.transport() == "nccl" && req.collective().empty() && req.channel_descriptor().empty())
      resp.set_channel_descriptor("channel-" + req.channel());
    return resp;
  }
  absl::Status ReleaseRun(const v1::WorkerInfo& worker, const std::string& run_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    released.push_back(worker.worker_id() + ":" + run_id);
    return absl::OkStatus();
  }

  // Both roles answer with the same checksum (what a pair that agrees reports); the drafter adds
  // metrics whose loss falls with the step.
  absl::StatusOr<v1::RunStepResponse> RunStep(const v1::WorkerInfo& worker,
                                              const v1::RunStepRequest& req) override {
    if (on_step) on_step(worker, req);
    std::lock_guard<std::mutex> lock(mu_);
    steps.push_back(worker.worker_id() + ":" + std::to_string(req.step()));
    requests.push_back(req);
    auto it = step_errors.find(worker.worker_id());
    if (it != step_errors.end()) return it->second;
    v1::RunStepResponse resp;
    resp.set_checksum(static_cast<int64_t>(req.micro_batches_size()) +
                      (worker.role() == v1::WORKER_ROLE_DRAFTER ? drafter_checksum_offset : 0));
    if (worker.role() == v1::WORKER_ROLE_DRAFTER) {
      v1::StepMetrics* m = resp.mutable_metrics();
      m->set_step(req.step());
      m->set_loss(5.0 - 0.01 * static_cast<double>(req.step()));
      m->set_acceptance_length(1.5);
    }
    return resp;
  }

  // Answers with `eval_accepted` proposals accepted in each of 10 verifications (block size 4).
  absl::StatusOr<v1::EvaluateResponse> Evaluate(const v1::WorkerInfo& worker,
                                                const v1::EvaluateRequest& req) override {
    if (on_evaluate) on_evaluate();
    std::lock_guard<std::mutex> lock(mu_);
    eval_requests.push_back(req);
    eval_workers.push_back(worker.name());
    v1::EvaluateResponse resp;
    resp.set_prompts(req.prompts_size());
    resp.set_verifications(10);
    resp.set_accepted(10 * eval_accepted);
    resp.set_block_size(4);
    for (int64_t k = 0; k < 4; ++k) resp.add_accepted_at(k >= 1 && k <= eval_accepted ? 10 : 0);
    resp.set_new_tokens(10 * (eval_accepted + 1));
    resp.set_seconds(0.5);
    return resp;
  }

  // Rank 0 of an NCCL decoding group: an id naming the worker.
  absl::StatusOr<v1::OpenDecodeGroupResponse> OpenDecodeGroup(
      const v1::WorkerInfo& worker, const v1::OpenDecodeGroupRequest& req) override {
    std::lock_guard<std::mutex> lock(mu_);
    opened_groups.push_back(worker.name() + ":" + req.collective());
    v1::OpenDecodeGroupResponse resp;
    resp.set_nccl_unique_id("group-of-" + worker.name());
    return resp;
  }

  // Answers each prompt with its last token + 1, repeated up to its limit (a stop id ends it).
  absl::StatusOr<v1::GenerateResponse> Generate(const v1::WorkerInfo& worker,
                                                const v1::GenerateRequest& req) override {
    std::lock_guard<std::mutex> lock(mu_);
    generate_requests.push_back(req);
    v1::GenerateResponse resp;
    for (int i = 0; i < req.prompts_size(); ++i) {
      const int64_t limit = req.max_new_tokens(req.max_new_tokens_size() == 1 ? 0 : i);
      const auto& ids = req.prompts(i).ids();
      auto* out = resp.add_outputs();
      for (int64_t k = 0; k < limit; ++k) out->add_ids(ids[ids.size() - 1] + 1);
      resp.add_stopped(false);
    }
    return resp;
  }

  void CancelCalls(const v1::WorkerInfo& worker) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled.push_back(worker.worker_id());
  }

  // The highest step sent to any worker so far (-1: none).
  int64_t HighestStep() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t h = -1;
    for (const v1::RunStepRequest& r : requests) h = std::max(h, r.step());
    return h;
  }

  std::mutex mu_;
  std::vector<std::string> cancelled;  // worker ids, in CancelCalls order
  std::vector<v1::GenerateRequest> generate_requests;
  std::vector<v1::EvaluateRequest> eval_requests;
  std::vector<std::string> eval_workers;   // who answered each of eval_requests
  std::vector<std::string> opened_groups;  // "worker:collective", in OpenDecodeGroup order
  int64_t eval_accepted = 2;
  std::vector<std::string> steps;  // "worker:step" in call order
  std::vector<v1::RunStepRequest> requests;
  std::map<std::string, absl::Status> step_errors;  // by worker id
  int64_t drafter_checksum_offset = 0;              // nonzero: the drafter "trained" on other data
  std::function<void(const v1::WorkerInfo&, const v1::RunStepRequest&)> on_step;
  std::vector<std::string> prepared;
  std::vector<v1::PrepareRunRequest> prepare_requests;
  // What a faithful worker of that role echoes for the request (settings_echo.h RequiredEcho),
  // with the resume step read from the checkpoint's name (step-<N>.safetensors).
  static std::map<std::string, std::string> Echo(const v1::PrepareRunRequest& req, bool drafter) {
    absl::StatusOr<config::RunSpec> spec =
        config::ParseRunSpec(req.resolved_config_yaml(), "resolved", config::RunSpecOptions());
    if (!spec.ok()) return {};
    absl::StatusOr<model::TransformerConfig> target = run::RunTargetConfig(*spec);
    if (!target.ok()) return {};
    absl::StatusOr<v1::ResolvedTarget> r = ResolveTargetSettings(*spec, *target);
    if (!r.ok()) return {};
    std::string digits;
    for (char c : req.resume_checkpoint().substr(req.resume_checkpoint().rfind('/') + 1)) {
      if (absl::ascii_isdigit(static_cast<unsigned char>(c))) digits += c;
    }
    const std::map<std::string, std::string> expected =
        ExpectedSettings(*spec, {r->target_layer_ids().begin(), r->target_layer_ids().end()},
                         r->mask_token_id(), req.transport(), req.total_steps(),
                         digits.empty() ? 0 : std::stoll(digits), req.num_pairs());
    std::map<std::string, std::string> out;
    for (const std::string& k : RequiredEcho(drafter, req.tp_rank(), expected)) {
      out[k] = expected.at(k);
    }
    return out;
  }

  std::map<std::string, std::string> echo_overrides;  // settings every worker echoes
  std::set<std::string> echo_omit;                    // settings no worker echoes
  std::string kernel_overrides;                       // what every worker reports
  std::vector<std::string> released;
  std::map<std::string, absl::Status> prepare_errors;  // by worker id
  // Runs before each PrepareRun answers (outside the coordinator's lock, as a real RPC would).
  std::function<void(const v1::WorkerInfo&)> on_prepare;
  // Runs before each Evaluate answers; may throw (a dependency that fails badly).
  std::function<void()> on_evaluate;
};

}  // namespace dflash::coordinator

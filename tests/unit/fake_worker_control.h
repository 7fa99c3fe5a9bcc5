// A WorkerControl that records calls and answers from a script, for coordinator tests.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "services/coordinator/worker_control.h"

namespace dflash::coordinator {

class FakeWorkerControl : public WorkerControl {
 public:
  absl::StatusOr<v1::PrepareRunResponse> PrepareRun(const v1::WorkerInfo& worker,
                                                    const v1::PrepareRunRequest& req) override {
    if (on_prepare) on_prepare(worker);
    std::lock_guard<std::mutex> lock(mu_);
    prepared.push_back(worker.worker_id() + ":" + req.run_id());
    auto it = prepare_errors.find(worker.worker_id());
    if (it != prepare_errors.end()) return it->second;
    v1::PrepareRunResponse resp;
    (*resp.mutable_applied())["drafter.block_size"] = "16";
    return resp;
  }
  absl::Status ReleaseRun(const v1::WorkerInfo& worker, const std::string& run_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    released.push_back(worker.worker_id() + ":" + run_id);
    return absl::OkStatus();
  }

  std::mutex mu_;
  std::vector<std::string> prepared;
  std::vector<std::string> released;
  std::map<std::string, absl::Status> prepare_errors;  // by worker id
  // Runs before each PrepareRun answers (outside the coordinator's lock, as a real RPC would).
  std::function<void(const v1::WorkerInfo&)> on_prepare;
};

}  // namespace dflash::coordinator

// Workers known to the coordinator. Not thread-safe: the Coordinator serializes access.
// Registrations live in memory only: after a coordinator restart, a worker's next heartbeat gets
// NOT_FOUND and the worker registers again.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "dflash/v1/common.pb.h"

namespace dflash::coordinator {

class WorkerRegistry {
 public:
  // `incarnation` distinguishes this coordinator process from earlier ones: worker ids are
  // "w<N>-<incarnation>", so a worker still holding an id from before a restart is never taken
  // for another worker that registered since.
  WorkerRegistry(const Clock* clock, int64_t timeout_ms, std::string incarnation)
      : clock_(clock), timeout_ms_(timeout_ms), incarnation_(std::move(incarnation)) {}
  const std::string& incarnation() const { return incarnation_; }

  // Registers a worker. A worker that registers again under the same name (it restarted) keeps
  // its id; its old assignment is dropped, since the new process holds no run state.
  // `replaced`, when given, receives the registration this one replaces (same name), if any.
  absl::StatusOr<std::string> Register(const v1::WorkerInfo& info,
                                       std::optional<v1::WorkerInfo>* replaced = nullptr);

  // Records a heartbeat; NOT_FOUND for an unknown id. A down worker that heartbeats is up again.
  absl::Status Heartbeat(const std::string& worker_id, const v1::DeviceInfo& device);

  // Marks every worker silent for longer than the timeout as down; returns those that just went
  // down (each reported once).
  std::vector<v1::WorkerInfo> Sweep();
  // Marks a worker down now (an RPC to it found nobody there), so that placement does not offer
  // it the next run before its heartbeats time out; its next heartbeat brings it back up.
  void MarkDown(const std::string& worker_id, const std::string& why);

  // Idle (no run) and up workers of a role, in registration order.
  std::vector<v1::WorkerInfo> IdleWorkers(v1::WorkerRole role) const;
  absl::Status Assign(const std::string& worker_id, const std::string& run_id);
  // Clears the assignment of every worker holding run_id.
  void ReleaseRun(const std::string& run_id);

  absl::StatusOr<v1::WorkerInfo> Get(const std::string& worker_id) const;
  std::vector<v1::WorkerInfo> List() const;
  int64_t timeout_ms() const { return timeout_ms_; }

 private:
  const Clock* clock_;
  int64_t timeout_ms_;
  std::string incarnation_;
  int64_t next_id_ = 1;
  std::map<std::string, v1::WorkerInfo> workers_;  // by worker_id
  std::vector<std::string> order_;                 // registration order
};

}  // namespace dflash::coordinator

#include "services/coordinator/worker_registry.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace dflash::coordinator {

absl::StatusOr<std::string> WorkerRegistry::Register(const v1::WorkerInfo& info,
                                                     std::optional<v1::WorkerInfo>* replaced) {
  if (info.name().empty()) return absl::InvalidArgumentError("worker.name: must not be empty");
  if (info.role() != v1::WORKER_ROLE_TARGET && info.role() != v1::WORKER_ROLE_DRAFTER) {
    return absl::InvalidArgumentError("worker.role: must be target or drafter");
  }
  if (info.control_address().empty()) {
    return absl::InvalidArgumentError("worker.control_address: must not be empty");
  }
  const int64_t now = clock_->NowUnixMs();
  std::string id;
  for (const auto& [wid, w] : workers_) {
    if (w.name() == info.name()) id = wid;
  }
  if (!id.empty() && workers_[id].role() != info.role()) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker name '", info.name(), "' is registered with another role"));
  }
  if (id.empty()) {
    id = absl::StrCat("w", next_id_++, "-", incarnation_);
    order_.push_back(id);
  }
  v1::WorkerInfo& w = workers_[id];
  if (replaced != nullptr && !w.worker_id().empty()) *replaced = w;
  const std::string previous_run = w.run_id();
  w = info;
  w.set_worker_id(id);
  w.set_health(v1::WORKER_HEALTH_UP);
  w.clear_run_id();
  w.set_registered_unix_ms(now);
  w.set_last_heartbeat_unix_ms(now);
  LOG(INFO) << "worker " << id << " (" << info.name() << ", " << v1::WorkerRole_Name(info.role())
            << ") registered at " << info.control_address()
            << (previous_run.empty() ? "" : absl::StrCat("; dropped its old run ", previous_run));
  return id;
}

absl::Status WorkerRegistry::Heartbeat(const std::string& worker_id, const v1::DeviceInfo& device) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is not registered"));
  }
  v1::WorkerInfo& w = it->second;
  w.set_last_heartbeat_unix_ms(clock_->NowUnixMs());
  *w.mutable_device() = device;
  if (w.health() != v1::WORKER_HEALTH_UP) {
    LOG(INFO) << "worker " << worker_id << " (" << w.name() << ") is up again";
    w.set_health(v1::WORKER_HEALTH_UP);
  }
  return absl::OkStatus();
}

void WorkerRegistry::MarkDown(const std::string& worker_id, const std::string& why) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.health() != v1::WORKER_HEALTH_UP) return;
  it->second.set_health(v1::WORKER_HEALTH_DOWN);
  LOG(WARNING) << "worker " << worker_id << " (" << it->second.name() << ") marked down: " << why;
}

std::vector<v1::WorkerInfo> WorkerRegistry::Sweep() {
  std::vector<v1::WorkerInfo> down;
  const int64_t now = clock_->NowUnixMs();
  for (const std::string& id : order_) {
    v1::WorkerInfo& w = workers_[id];
    if (w.health() == v1::WORKER_HEALTH_UP && now - w.last_heartbeat_unix_ms() > timeout_ms_) {
      w.set_health(v1::WORKER_HEALTH_DOWN);
      LOG(WARNING) << "worker " << id << " (" << w.name() << ") marked down: silent for "
                   << (now - w.last_heartbeat_unix_ms()) << " ms (worker_timeout " << timeout_ms_
                   << " ms)";
      down.push_back(w);
    }
  }
  return down;
}

std::vector<v1::WorkerInfo> WorkerRegistry::IdleWorkers(v1::WorkerRole role) const {
  std::vector<v1::WorkerInfo> idle;
  for (const std::string& id : order_) {
    const v1::WorkerInfo& w = workers_.at(id);
    if (w.role() == role && w.health() == v1::WORKER_HEALTH_UP && w.run_id().empty()) {
      idle.push_back(w);
    }
  }
  return idle;
}

absl::Status WorkerRegistry::Assign(const std::string& worker_id, const std::string& run_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker ", worker_id));
  if (!it->second.run_id().empty() && it->second.run_id() != run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " already runs ", it->second.run_id()));
  }
  it->second.set_run_id(run_id);
  return absl::OkStatus();
}

void WorkerRegistry::ReleaseRun(const std::string& run_id) {
  for (auto& [id, w] : workers_) {
    if (w.run_id() == run_id) w.clear_run_id();
  }
}

absl::StatusOr<v1::WorkerInfo> WorkerRegistry::Get(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker ", worker_id));
  return it->second;
}

std::vector<v1::WorkerInfo> WorkerRegistry::List() const {
  std::vector<v1::WorkerInfo> all;
  for (const std::string& id : order_) all.push_back(workers_.at(id));
  return all;
}

}  // namespace dflash::coordinator

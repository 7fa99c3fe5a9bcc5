#include "services/coordinator/placement.h"

#include "absl/strings/str_cat.h"

namespace dflash::coordinator {

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

std::string DeviceKey(const v1::WorkerInfo& worker) {
  return absl::StrCat(HostOf(worker.control_address()), "/", worker.device().kind(),
                      worker.device().index());
}

std::string Collective(const v1::WorkerInfo& drafter) {
  return drafter.device().kind() == "cuda" ? "nccl" : "host";
}

std::vector<std::vector<v1::WorkerInfo>> GroupTargets(const std::vector<v1::WorkerInfo>& targets,
                                                      int64_t n) {
  std::vector<std::vector<v1::WorkerInfo>> groups;
  std::vector<bool> used(targets.size(), false);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (used[i]) continue;
    std::vector<size_t> members = {i};
    for (size_t j = i + 1; j < targets.size() && static_cast<int64_t>(members.size()) < n; ++j) {
      const v1::WorkerInfo& t = targets[j];
      if (used[j] || HostOf(t.control_address()) != HostOf(targets[i].control_address()) ||
          t.device().kind() != targets[i].device().kind()) {
        continue;
      }
      bool same_gpu = false;
      for (size_t m : members) {
        same_gpu =
            same_gpu || (t.device().kind() == "cuda" && DeviceKey(t) == DeviceKey(targets[m]));
      }
      if (!same_gpu) members.push_back(j);
    }
    if (static_cast<int64_t>(members.size()) < n) continue;
    groups.emplace_back();
    for (size_t m : members) {
      used[m] = true;
      groups.back().push_back(targets[m]);
    }
  }
  return groups;
}

std::string TargetCollective(const v1::WorkerInfo& target) {
  return target.device().kind() == "cuda" ? "nccl" : "host";
}

absl::Status CheckDrafterGroup(const WorkerPairs& pairs) {
  const v1::WorkerInfo& first = pairs[0].second;
  const bool host = Collective(first) == "host";
  for (size_t i = 1; i < pairs.size(); ++i) {
    const v1::WorkerInfo& d = pairs[i].second;
    if (Collective(d) != Collective(first)) {
      return absl::FailedPreconditionError(
          absl::StrCat("placement.pairs: drafters ", first.name(), " and ", d.name(),
                       " are on a CPU and a GPU; data-parallel drafters must all be one kind"));
    }
    for (size_t j = 0; j < i; ++j) {
      const v1::WorkerInfo& e = pairs[j].second;
      if (host && HostOf(d.control_address()) != HostOf(e.control_address())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "placement.pairs: ", pairs.size(), " CPU drafters on more than one machine (", e.name(),
            ", ", d.name(), "): CPU drafters sum gradients through shared memory on one machine"));
      }
      if (!host && DeviceKey(d) == DeviceKey(e)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "placement.pairs: drafters ", e.name(), " and ", d.name(), " share GPU ",
            d.device().index(), "; NCCL refuses two ranks on one device (one drafter per GPU)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveTransport(const config::RunSpec& spec,
                                             const v1::WorkerInfo& target,
                                             const v1::WorkerInfo& drafter) {
  const bool gpus = target.device().kind() == "cuda" && drafter.device().kind() == "cuda";
  const bool same_gpu = gpus && DeviceKey(target) == DeviceKey(drafter);
  const bool same_host = HostOf(target.control_address()) == HostOf(drafter.control_address());
  const std::string t = spec.placement.transport != "auto" ? spec.placement.transport
                                                           : std::string(same_gpu ? "cuda_ipc"
                                                                         : gpus   ? "nccl"
                                                                                  : "host");
  const auto refuse = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("placement.transport: ", t, " ", why, "; target ", target.name(), " on ",
                     DeviceKey(target), ", drafter ", drafter.name(), " on ", DeviceKey(drafter)));
  };
  if (t == "cuda_ipc" && !same_gpu) {
    return refuse("needs the target and the drafter on the same GPU (nccl is for two GPUs)");
  }
  if (t == "nccl" && !gpus) return refuse("needs the target and the drafter on GPUs");
  if (t == "nccl" && same_gpu) {
    return refuse("needs two GPUs: NCCL refuses two ranks on one device (cuda_ipc is for one GPU)");
  }
  if (t == "host" && !same_host) {
    return refuse("moves features through shared memory on one machine (nccl crosses machines)");
  }
  return t;
}

PlanTargets PlanTargetsOf(const config::RunSpec& spec, const std::vector<v1::WorkerInfo>& workers) {
  PlanTargets p;
  bool shared_gpu = false;
  for (const v1::WorkerInfo& w : workers) {
    if (w.device().kind() != "cuda") continue;
    const int64_t total = static_cast<int64_t>(w.device().total_bytes());
    if (w.role() == v1::WORKER_ROLE_TARGET && total > p.target_capacity) {
      p.target_capacity = total;
      p.target_worker = w.name();
    }
    if (w.role() == v1::WORKER_ROLE_DRAFTER && total > p.drafter_capacity) {
      p.drafter_capacity = total;
      p.drafter_worker = w.name();
    }
    for (const v1::WorkerInfo& o : workers) {
      if (w.role() == v1::WORKER_ROLE_TARGET && o.role() == v1::WORKER_ROLE_DRAFTER &&
          o.device().kind() == "cuda" && DeviceKey(w) == DeviceKey(o)) {
        shared_gpu = true;
        if (total > p.shared_capacity) {
          p.shared_capacity = total;
          p.shared_gpu = absl::StrCat("GPU ", w.device().index(), " of ", w.name());
        }
      }
    }
  }
  p.transport = spec.placement.transport;
  if (p.transport == "auto") {
    const bool gpus = !p.target_worker.empty() && !p.drafter_worker.empty();
    p.transport = shared_gpu ? "cuda_ipc" : gpus ? "nccl" : "host";
  }
  return p;
}

}  // namespace dflash::coordinator

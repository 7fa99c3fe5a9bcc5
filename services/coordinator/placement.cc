#include "services/coordinator/placement.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"

namespace dflash::coordinator {

EvalGroupNeed EvalGroupWanted(const config::RunSpec& spec,
                              const std::vector<std::vector<v1::WorkerInfo>>& groups) {
  if (spec.eval.every_steps == 0 || spec.eval.worker == "pair") return EvalGroupNeed::kNo;
  if (spec.eval.worker == "reserved") return EvalGroupNeed::kYes;
  const bool gpu_tp = spec.placement.target_parallel > 1 && !groups.empty() &&
                      groups[0][0].device().kind() == "cuda";
  return gpu_tp ? EvalGroupNeed::kIfIdle : EvalGroupNeed::kNo;
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

std::string DeviceKey(const v1::WorkerInfo& worker) {
  return absl::StrCat(HostOf(worker.control_address()), "/", worker.device().kind(),
                      worker.device().index());
}

transport::Collective DrafterCollective(const v1::WorkerInfo& drafter) {
  return transport::CollectiveFor(drafter.device().kind() == "cuda");
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

transport::Collective TargetCollective(const v1::WorkerInfo& target) {
  return transport::CollectiveFor(target.device().kind() == "cuda");
}

absl::Status CheckDrafterGroup(const WorkerPairs& pairs) {
  const v1::WorkerInfo& first = pairs[0].second;
  const bool host = DrafterCollective(first) == transport::Collective::kHost;
  for (size_t i = 1; i < pairs.size(); ++i) {
    const v1::WorkerInfo& d = pairs[i].second;
    if (DrafterCollective(d) != DrafterCollective(first)) {
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

absl::StatusOr<transport::Transport> ResolveTransport(const config::RunSpec& spec,
                                                      const v1::WorkerInfo& target,
                                                      const v1::WorkerInfo& drafter) {
  transport::PairLocation where;
  where.both_gpus = target.device().kind() == "cuda" && drafter.device().kind() == "cuda";
  where.same_gpu = where.both_gpus && DeviceKey(target) == DeviceKey(drafter);
  where.same_host = HostOf(target.control_address()) == HostOf(drafter.control_address());
  ASSIGN_OR_RETURN(transport::Transport t,
                   transport::ChosenTransport(spec.placement.transport, where));
  const std::string problem = transport::PlacementProblem(t, where);
  if (!problem.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("placement.transport: ", transport::TransportName(t), " ", problem,
                     "; target ", target.name(), " on ", DeviceKey(target), ", drafter ",
                     drafter.name(), " on ", DeviceKey(drafter)));
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
  transport::PairLocation where;  // of the pair these two roles' workers would make
  where.both_gpus = !p.target_worker.empty() && !p.drafter_worker.empty();
  where.same_gpu = shared_gpu;
  where.same_host = true;
  // Validated with the run.yaml (config::TransportChoices).
  p.transport = transport::ChosenTransport(spec.placement.transport, where)
                    .value_or(transport::AutoTransport(where));
  return p;
}

std::string GpuMemoryNow::Describe() const {
  auto gib = [](double bytes) { return absl::StrFormat("%.1f GiB", bytes / (1ull << 30)); };
  return absl::StrCat("GPU ", index, " of host ", host, ": ", gib(free), " free, the ",
                      workers.size() > 1 ? "pair" : "worker", " needs ", gib(need),
                      "; held by other processes: ", gib(others));
}

std::vector<GpuMemoryNow> MemoryNow(const std::vector<DeviceNeed>& needs,
                                    const std::vector<v1::WorkerInfo>& registered) {
  std::vector<GpuMemoryNow> gpus;
  std::map<std::string, size_t> at;  // DeviceKey -> index in gpus
  for (const DeviceNeed& n : needs) {
    const v1::DeviceInfo& d = n.worker.device();
    if (d.kind() != "cuda") continue;
    auto [it, fresh] = at.try_emplace(DeviceKey(n.worker), gpus.size());
    if (fresh) {
      GpuMemoryNow g;
      g.host = HostOf(n.worker.control_address());
      g.index = d.index();
      g.total = d.total_bytes();
      g.free = d.free_bytes();
      gpus.push_back(g);
    }
    GpuMemoryNow& g = gpus[it->second];
    g.need += n.bytes;
    g.known = g.known && d.free_bytes() > 0;
    g.free = std::min<uint64_t>(g.free, d.free_bytes());
    if (std::find(g.workers.begin(), g.workers.end(), n.worker.name()) == g.workers.end()) {
      g.workers.push_back(n.worker.name());
      g.placed_own += d.process_reserved_bytes();
    }
  }
  for (const auto& [key, i] : at) {
    GpuMemoryNow& g = gpus[i];
    for (const v1::WorkerInfo& w : registered) {
      // A worker marked down (gone, or a process that ended) holds nothing: its last report
      // would hide the memory another process holds now.
      if (w.health() != v1::WORKER_HEALTH_UP) continue;
      if (w.device().kind() == "cuda" && DeviceKey(w) == key) {
        g.all_workers += w.device().process_reserved_bytes();
      }
    }
    const int64_t others = static_cast<int64_t>(g.total) - static_cast<int64_t>(g.free) -
                           static_cast<int64_t>(g.all_workers);
    g.others = static_cast<uint64_t>(std::max<int64_t>(0, others));
  }
  return gpus;
}

std::string FreeMemoryShortfall(const std::vector<DeviceNeed>& needs,
                                const std::vector<v1::WorkerInfo>& registered) {
  for (const GpuMemoryNow& g : MemoryNow(needs, registered)) {
    if (!g.Fits()) return g.Describe();
  }
  return "";
}

}  // namespace dflash::coordinator

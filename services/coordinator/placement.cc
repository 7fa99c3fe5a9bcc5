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

std::string ResolveTransport(const config::RunSpec& spec, const v1::WorkerInfo& target,
                             const v1::WorkerInfo& drafter) {
  if (spec.placement.transport != "auto") return spec.placement.transport;
  const bool same_gpu = target.device().kind() == "cuda" && DeviceKey(target) == DeviceKey(drafter);
  return same_gpu ? "cuda_ipc" : "host";
}

}  // namespace dflash::coordinator

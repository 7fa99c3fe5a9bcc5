#include "common/transport/transport.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dflash::transport {
namespace {

// One row per transport, in the order that run.yaml's docs and its error list them.
struct Row {
  Transport transport;
  const char* name;
  bool device_features;
  FeatureBuffers buffers;
};

constexpr Row kRows[] = {
    // Two device slots on the target's GPU, two receive buffers on the drafter's.
    {Transport::kNccl, "nccl", true, {2, 0, 2, false}},
    // Two device slots on the GPU both workers share; the drafter reads them in place.
    {Transport::kCudaIpc, "cuda_ipc", true, {2, 0, 0, true}},
    // The message (features inside) through a shared-memory ring, copied to the drafter's device.
    {Transport::kHost, "host", false, {0, 1, 0, false}},
};

const Row& RowOf(Transport transport) {
  for (const Row& r : kRows) {
    if (r.transport == transport) return r;
  }
  return kRows[0];
}

}  // namespace

std::vector<std::string> TransportNames() {
  std::vector<std::string> names;
  for (const Row& r : kRows) names.emplace_back(r.name);
  return names;
}

absl::StatusOr<Transport> ParseTransport(std::string_view name) {
  for (const Row& r : kRows) {
    if (name == r.name) return r.transport;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("placement.transport: '", absl::string_view(name.data(), name.size()),
                   "' is none of ", absl::StrJoin(TransportNames(), ", ")));
}

const char* TransportName(Transport transport) { return RowOf(transport).name; }

bool DeviceFeatures(Transport transport) { return RowOf(transport).device_features; }

absl::Status CheckTransportDevice(Transport transport, int gpu) {
  if (!DeviceFeatures(transport) || gpu >= 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("placement.transport: ", TransportName(transport),
                   " needs the target and drafter workers on GPUs; this worker runs on the CPU"));
}

Transport AutoTransport(const PairLocation& where) {
  if (where.same_gpu) return Transport::kCudaIpc;
  return where.both_gpus ? Transport::kNccl : Transport::kHost;
}

absl::StatusOr<Transport> ChosenTransport(std::string_view setting, const PairLocation& where) {
  if (setting == "auto") return AutoTransport(where);
  return ParseTransport(setting);
}

std::string PlacementProblem(Transport transport, const PairLocation& where) {
  switch (transport) {
    case Transport::kCudaIpc:
      if (!where.same_gpu) {
        return "needs the target and the drafter on the same GPU (nccl is for two GPUs)";
      }
      return "";
    case Transport::kNccl:
      if (!where.both_gpus) return "needs the target and the drafter on GPUs";
      if (where.same_gpu) {
        return "needs two GPUs: NCCL refuses two ranks on one device (cuda_ipc is for one GPU)";
      }
      return "";
    case Transport::kHost:
      if (!where.same_host) {
        return "moves features through shared memory on one machine (nccl crosses machines)";
      }
      return "";
  }
  return "";
}

FeatureBuffers BuffersOf(Transport transport) { return RowOf(transport).buffers; }

Collective CollectiveFor(bool on_gpu) { return on_gpu ? Collective::kNccl : Collective::kHost; }

const char* CollectiveName(Collective collective) {
  return collective == Collective::kNccl ? "nccl" : "host";
}

absl::StatusOr<Collective> ParseCollective(std::string_view name, std::string_view field) {
  if (name == "host") return Collective::kHost;
  if (name == "nccl") return Collective::kNccl;
  return absl::InvalidArgumentError(absl::StrCat(absl::string_view(field.data(), field.size()),
                                                 ": '", absl::string_view(name.data(), name.size()),
                                                 "' is neither host nor nccl"));
}

}  // namespace dflash::transport

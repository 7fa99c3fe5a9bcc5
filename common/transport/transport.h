// The feature transports by name, and what each asks of a pair's placement and of its memory
// (architecture.md, "Transports"). Plain values: no CUDA, NCCL or shared memory here, so that the
// coordinator, the memory planner and the run.yaml checks decide by transport without linking its
// implementation (feature_channel.h, library dflash_transport).
//
// Adding a transport: a value of Transport and its row in transport.cc (name, placement rule,
// buffers), then its sender and receiver in feature_channel.cc.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dflash::transport {

enum class Transport { kHost, kCudaIpc, kNccl };

// Every transport's name: "nccl", "cuda_ipc", "host" (the order of run.yaml's docs).
std::vector<std::string> TransportNames();
// A name of TransportNames() (placement.transport once resolved: "auto" is the coordinator's to
// resolve); INVALID_ARGUMENT naming placement.transport otherwise.
absl::StatusOr<Transport> ParseTransport(std::string_view name);
const char* TransportName(Transport transport);
// Whether the features stay in device memory (cuda_ipc, nccl).
bool DeviceFeatures(Transport transport);
// FAILED_PRECONDITION when the transport needs a GPU and this worker has none (gpu < 0).
absl::Status CheckTransportDevice(Transport transport, int gpu);

// Where a target/drafter pair's two workers run.
struct PairLocation {
  bool same_host = false;  // both on one machine
  bool both_gpus = false;  // each on a GPU
  bool same_gpu = false;   // both on one GPU
};
// What placement.transport: auto picks for a pair at `where`: cuda_ipc on one GPU, nccl on two
// GPUs, host otherwise.
Transport AutoTransport(const PairLocation& where);
// placement.transport (`setting`) for a pair at `where`: AutoTransport for "auto", else the named
// transport (INVALID_ARGUMENT as ParseTransport for another name).
absl::StatusOr<Transport> ChosenTransport(std::string_view setting, const PairLocation& where);
// Why `transport` cannot carry the features of a pair at `where`, as the end of placement's
// refusal ("needs the target and the drafter on GPUs"); empty when it can.
std::string PlacementProblem(Transport transport, const PairLocation& where);

// The feature buffers a transport keeps, in micro-batches of features (token_budget x K*H) of
// the features' dtype, for the memory planner.
struct FeatureBuffers {
  int target_device_slots = 0;      // the sender's device slots (cudaMalloc, outside the allocator)
  int drafter_device_copies = 0;    // the receiver's copy to its device (the allocator's)
  int drafter_receive_buffers = 0;  // the receiver's device buffers (outside the allocator)
  bool pair_shares_gpu = false;     // both workers on one GPU: the plan checks their sum
};
FeatureBuffers BuffersOf(Transport transport);

// How a group of worker processes sums tensors (group.h): the data-parallel drafters' gradients,
// a tensor-parallel target's partial layer outputs. `host`: shared memory on one machine; `nccl`:
// one GPU per rank.
enum class Collective { kHost, kNccl };
// The collective of processes on GPUs (nccl) or on CPUs (host).
Collective CollectiveFor(bool on_gpu);
const char* CollectiveName(Collective collective);
// "host" or "nccl"; INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<Collective> ParseCollective(std::string_view name, std::string_view field);

}  // namespace dflash::transport

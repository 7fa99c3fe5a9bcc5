// The feature channel of a pair (architecture.md, "Transports"): how a target worker hands each
// micro-batch's packed batch and features [T, K*H] to its drafter worker, one interface over the
// three transports:
//
//   host      the features travel inside the message through a shared-memory ring (shm_ring.h),
//             covered by the message's CRC-32 (feature_message.h); any two processes of a host.
//   cuda_ipc  the features stay on the GPU the pair shares: the target writes them into one of
//             the ring's device slots (cuda_ipc.h) and the message names the slot.
//   nccl      the features go device to device over a two-rank NCCL communicator of the pair's
//             own (nccl_channel.h): two GPUs, of one machine or of several.
//
// On cuda_ipc and nccl the sender takes the features' checksum (feature_checksum.h) after they
// were written and sends it in the message; the receiver recomputes it before handing them out
// and refuses them (DATA_LOSS) when they differ. Every wait ends at Options::timeout with
// DEADLINE_EXCEEDED; Abort() from any thread ends every wait with ABORTED.
//
// Adding a transport: a value of Transport and its row in transport.cc (name, placement rule,
// buffers), and a sender and a receiver in feature_channel.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/batching/packed_batch.h"
#include "common/transport/feature_message.h"
#include "common/transport/transport.h"

namespace dflash::transport {

struct FeatureChannelOptions {
  Transport transport = Transport::kHost;
  // host, cuda_ipc: the shared-memory ring's name (unique per run attempt). nccl, receiver: the
  // sender's descriptor().
  std::string name;
  int gpu = -1;        // this process's CUDA device (cuda_ipc, nccl)
  uint32_t slots = 2;  // messages in flight: how far the sender may run ahead
  absl::Duration timeout = absl::Minutes(10);      // every wait
  absl::Duration open_timeout = absl::Minutes(2);  // receiver: for the sender's ring to appear
  // Sender: the largest micro-batch, which sizes the slots.
  int64_t max_tokens = 0;
  int64_t feature_dim = 0;
  FeatureDType dtype = FeatureDType::kFloat32;
  // Sender: called with the message's index and, on the device transports, the features after
  // their checksum was taken (host: the message after its CRC-32), before they are published.
  // Only the test executables (services/worker_common/test_hooks.h) and transport_bench set it,
  // to corrupt what the receiver must refuse.
  std::function<void(void* features, size_t bytes, uint64_t index)> after_checksum;
};

class FeatureSender {
 public:
  // Creates the channel: host, cuda_ipc: the ring (a stale one of the same name is replaced) and
  // cuda_ipc's device slots; nccl: the channel and its descriptor.
  static absl::StatusOr<std::unique_ptr<FeatureSender>> Create(const FeatureChannelOptions& o);
  virtual ~FeatureSender() = default;

  virtual Transport transport() const = 0;
  // What the receiver's FeatureChannelOptions::name must be (the ring's name, or nccl's
  // descriptor).
  virtual std::string handoff() const = 0;
  // One line for the worker's log: the transport, slots and their size.
  virtual std::string Describe() const = 0;
  // Device transports: the device buffer for the next batch's features (max_tokens rows), once
  // the batch that last used it is done with it; host: nullptr (the features go in Send).
  virtual absl::StatusOr<void*> NextBuffer() = 0;
  // Sends `batch` and its features: host: `features` points to its T x feature_dim elements in
  // host memory; device: the buffer NextBuffer returned, written by work on the default stream.
  // Returns the message's CRC-32. `bytes_sent` (optional) gets the bytes moved.
  virtual absl::StatusOr<uint32_t> Send(uint64_t batch_id, const batching::PackedBatch& batch,
                                        const void* features, int64_t* bytes_sent) = 0;
  // Messages waiting in the ring (0 on nccl).
  virtual int64_t Depth() const { return 0; }
  virtual void Abort() = 0;
};

// A batch as the receiver holds it until Release().
struct ReceivedFeatures {
  DecodedFeatures decoded;     // the packed batch, feature_dim, dtype, the message's CRC-32
  const void* data = nullptr;  // T x feature_dim elements: device memory on cuda_ipc and nccl,
                               // the ring slot's host memory on host (copy it before Release)
  bool on_device = false;
  int64_t bytes = 0;            // the message and the features
  double wait_seconds = 0;      // waiting for the message and the features
  double checksum_seconds = 0;  // recomputing the device checksum
};

class FeatureReceiver {
 public:
  // host, cuda_ipc: the ring is opened at the first Receive (waiting up to open_timeout for the
  // sender to create it); nccl: the channel is made from the descriptor here, joined at the
  // first transfer.
  static absl::StatusOr<std::unique_ptr<FeatureReceiver>> Create(const FeatureChannelOptions& o);
  virtual ~FeatureReceiver() = default;

  virtual Transport transport() const = 0;
  // The next batch, which must be `batch_id` (otherwise FAILED_PRECONDITION, the channel
  // aborted); DATA_LOSS when the message or the features' checksum is not what was sent. Once a
  // message has arrived its slot is held, whatever the status: Release() hands it back.
  virtual absl::StatusOr<ReceivedFeatures> Receive(uint64_t batch_id) = 0;
  // Hands the batch's slot back once the work reading it (queued on the default stream) allows:
  // cuda_ipc waits for the device, nccl orders the slot's reuse after that work.
  virtual absl::Status Release() = 0;
  virtual int64_t Depth() const { return 0; }
  virtual void Abort() = 0;
};

}  // namespace dflash::transport

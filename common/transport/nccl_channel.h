// The `nccl` feature transport (architecture.md, "Transports"): a target and its drafter on
// different GPUs (of one machine or of several) move each micro-batch over a two-rank NCCL
// communicator of their own, rank 0 the target (sender), rank 1 the drafter (receiver). NCCL
// refuses two ranks on one device, which is what `cuda_ipc` is for.
//
// A message is two point-to-point transfers on the channel's stream, in order: a fixed-size frame
// (batch id, the feature message's length and the message: the packed batch and the feature
// shape, feature_message.h) and then the features themselves, exactly T * feature_dim elements,
// device to device. The sender writes the features into a device slot (NextFeatureBuffer) with
// work queued on the device's default stream (LibTorch's), then Send() queues the transfers
// behind that work and returns: up to `slots` messages are in flight, which bounds how far the
// target runs ahead. The receiver waits for a frame (ReceiveFrame, checking the batch id), then
// for its features (ReceiveFeatures, into one of its own `slots` device buffers), trains on them
// with work on the default stream, and Release()s the slot, which the next transfer into that
// buffer waits for on the device.
//
// Bootstrap through the coordinator: the target makes the channel's descriptor (NewDescriptor:
// NCCL's unique id and the two transfer sizes, so that both sides agree on them by construction)
// in PrepareRun, the coordinator hands it to the drafter. Both join at their first transfer (the
// communicator's initialization is non-blocking and polled). Every wait has the deadline of
// Options::timeout; on expiry, on a NCCL error or on Abort() from another thread the communicator
// is aborted (ncclCommAbort) and every later call fails with ABORTED. Built with CUDA and NCCL
// only; otherwise Create is UNIMPLEMENTED.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dflash::transport {

class NcclChannel {
 public:
  // The sender's side, before the receiver exists: a fresh NCCL unique id (this process holds
  // its bootstrap root) with the largest feature message (MaxFeatureMessageBytes) and the largest
  // features (token_budget * feature_dim * element size), as bytes for the coordinator to carry.
  static absl::StatusOr<std::string> NewDescriptor(size_t max_message_bytes,
                                                   size_t max_feature_bytes);
  struct Options {
    int rank = 0;        // 0: the target (sends), 1: the drafter (receives)
    int device = 0;      // this process's CUDA device
    uint32_t slots = 2;  // messages in flight (sender) / receive buffers (receiver)
    absl::Duration timeout = absl::Minutes(10);
  };
  // Checks the descriptor and allocates the slots; the communicator is joined at the first
  // transfer.
  static absl::StatusOr<std::unique_ptr<NcclChannel>> Create(const std::string& descriptor,
                                                             const Options& options);
  size_t max_message_bytes() const { return max_message_bytes_; }
  size_t max_feature_bytes() const { return max_feature_bytes_; }
  ~NcclChannel();
  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;

  // Sender: the device buffer (max_feature_bytes) of the next message, once the transfer that
  // last used it has finished.
  absl::StatusOr<void*> NextFeatureBuffer();
  // Sender: queues the frame and the first `feature_bytes` of the buffer NextFeatureBuffer
  // returned, behind the work already queued on the default stream; does not wait.
  absl::Status Send(uint64_t batch_id, absl::Span<const uint8_t> message, size_t feature_bytes);

  // Receiver: waits for the next frame; FAILED_PRECONDITION (naming both ids) when it carries
  // another batch than `expected_batch_id` (the channel is then aborted: the pair is out of step).
  absl::StatusOr<absl::Span<const uint8_t>> ReceiveFrame(uint64_t expected_batch_id);
  // Receiver: waits for the frame's features (`feature_bytes`, as the message describes them) and
  // returns the device buffer holding them, valid until Release().
  absl::StatusOr<const void*> ReceiveFeatures(size_t feature_bytes);
  // Receiver: the work reading the features is queued on the default stream; the buffer is
  // reused once that work has run.
  absl::Status Release();

  // From any thread: ends every wait with ABORTED and aborts the communicator.
  void Abort();

  // Messages sent / received so far.
  uint64_t count() const { return count_; }

 private:
  struct State;
  NcclChannel(std::string unique_id, Options options, size_t max_message_bytes,
              size_t max_feature_bytes);
  absl::Status EnsureInitialized();
  // Polls the communicator and `event` (null: the communicator only) to the deadline.
  absl::Status Wait(void* event, const std::string& what);
  absl::Status Fail(absl::Status status);  // aborts the communicator, returns `status`

  std::string unique_id_;
  Options options_;
  size_t max_message_bytes_ = 0, max_feature_bytes_ = 0;
  std::unique_ptr<State> state_;
  std::atomic<bool> abort_requested_{false};
  uint64_t count_ = 0;
};

}  // namespace dflash::transport

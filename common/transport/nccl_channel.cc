#include "common/transport/nccl_channel.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#if DFLASH_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/transport/nccl_core.h"
#endif

namespace dflash::transport {

#if DFLASH_HAVE_NCCL

namespace {

// Frame: batch id (8 bytes), message length (8 bytes), the message.
constexpr size_t kFrameHead = 16;

}  // namespace

struct NcclChannel::State {
  std::unique_ptr<NcclCore> core;
  cudaStream_t stream = nullptr;
  size_t frame_bytes = 0;
  struct Slot {
    void* frame_dev = nullptr;
    uint8_t* frame_host = nullptr;  // pinned
    void* features = nullptr;
    cudaEvent_t produced = nullptr;  // sender: the features are written (default stream)
    cudaEvent_t done = nullptr;      // the slot's transfers have finished (channel stream)
    cudaEvent_t consumed = nullptr;  // receiver: released (default stream)
    bool pending = false;            // sender: `done` not yet seen
    bool consumed_recorded = false;  // receiver
  };
  std::vector<Slot> slots;
  bool initialized = false;
  bool buffer_taken = false;  // sender: NextFeatureBuffer before Send
  int receiving = -1;         // receiver: the slot between ReceiveFrame and Release
};

absl::StatusOr<std::string> NcclChannel::NewDescriptor(size_t max_message_bytes,
                                                       size_t max_feature_bytes) {
  if (max_message_bytes == 0 || max_feature_bytes == 0) {
    return absl::InvalidArgumentError("nccl channel: message and feature sizes must be positive");
  }
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return absl::InternalError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  const uint64_t sizes[2] = {max_message_bytes, max_feature_bytes};
  return absl::StrCat(std::string(id.internal, sizeof(id.internal)),
                      std::string(reinterpret_cast<const char*>(sizes), sizeof(sizes)));
}

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Create(const std::string& descriptor,
                                                                 const Options& options) {
  if (options.rank != 0 && options.rank != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl channel: rank ", options.rank, " (0 is the target, 1 the drafter)"));
  }
  constexpr size_t kIdBytes = sizeof(ncclUniqueId::internal);
  uint64_t sizes[2] = {0, 0};
  if (descriptor.size() != kIdBytes + sizeof(sizes)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl channel: a descriptor of ",
                                                   descriptor.size(), " bytes, not ",
                                                   kIdBytes + sizeof(sizes)));
  }
  std::memcpy(sizes, descriptor.data() + kIdBytes, sizeof(sizes));
  if (options.slots < 1 || sizes[0] == 0 || sizes[1] == 0) {
    return absl::InvalidArgumentError(
        "nccl channel: slots and the descriptor's transfer sizes must be positive");
  }
  std::unique_ptr<NcclChannel> ch(
      new NcclChannel(descriptor.substr(0, kIdBytes), options, sizes[0], sizes[1]));
  State& s = *ch->state_;
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return s.core->Cuda(e, absl::StrCat("cudaSetDevice(", options.device, ")"));
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return s.core->Cuda(e, "creating its stream");
  }
  s.frame_bytes = (kFrameHead + ch->max_message_bytes_ + 255) / 256 * 256;
  s.slots.resize(options.slots);
  for (State::Slot& slot : s.slots) {
    cudaError_t e = cudaMalloc(&slot.frame_dev, s.frame_bytes);
    if (e == cudaSuccess)
      e = cudaMallocHost(reinterpret_cast<void**>(&slot.frame_host), s.frame_bytes);
    if (e == cudaSuccess) e = cudaMalloc(&slot.features, ch->max_feature_bytes_);
    for (cudaEvent_t* ev : {&slot.produced, &slot.done, &slot.consumed}) {
      if (e == cudaSuccess) e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
      return s.core->Cuda(e, absl::StrCat("allocating ", options.slots, " slots of ",
                                          ch->max_feature_bytes_, " + ", s.frame_bytes, " bytes"));
    }
  }
  return ch;
}

NcclChannel::NcclChannel(std::string unique_id, Options options, size_t max_message_bytes,
                         size_t max_feature_bytes)
    : unique_id_(std::move(unique_id)),
      options_(options),
      max_message_bytes_(max_message_bytes),
      max_feature_bytes_(max_feature_bytes),
      state_(std::make_unique<State>()) {
  state_->core = std::make_unique<NcclCore>("nccl channel", options_.rank, options_.timeout,
                                            &abort_requested_);
}

NcclChannel::~NcclChannel() {
  State& s = *state_;
  cudaSetDevice(options_.device);
  s.core.reset();  // aborts the communicator: never waits for a peer that is gone
  if (s.stream != nullptr) cudaStreamSynchronize(s.stream);
  for (State::Slot& slot : s.slots) {
    if (slot.frame_dev != nullptr) cudaFree(slot.frame_dev);
    if (slot.frame_host != nullptr) cudaFreeHost(slot.frame_host);
    if (slot.features != nullptr) cudaFree(slot.features);
    for (cudaEvent_t ev : {slot.produced, slot.done, slot.consumed}) {
      if (ev != nullptr) cudaEventDestroy(ev);
    }
  }
  if (s.stream != nullptr) cudaStreamDestroy(s.stream);
}

absl::Status NcclChannel::Fail(absl::Status status) { return state_->core->Fail(status); }

absl::Status NcclChannel::Wait(void* event, const std::string& what) {
  NcclCore& core = *state_->core;
  if (event == nullptr) return core.Wait(what);
  return core.Wait(what, [&]() {
    return CudaDone(cudaEventQuery(static_cast<cudaEvent_t>(event)), core, what);
  });
}

absl::Status NcclChannel::EnsureInitialized() {
  State& s = *state_;
  if (absl::Status st = s.core->CheckUsable(); !st.ok()) return Fail(st);
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return s.core->Cuda(e, "cudaSetDevice");
  }
  if (s.initialized) return absl::OkStatus();
  s.initialized = true;
  return s.core->Join(unique_id_, 2,
                      options_.rank == 0 ? "the drafter to join" : "the target to join");
}

absl::StatusOr<void*> NcclChannel::NextFeatureBuffer() {
  if (options_.rank != 0) return absl::FailedPreconditionError("nccl channel: not the sender");
  if (absl::Status st = EnsureInitialized(); !st.ok()) return st;
  State& s = *state_;
  State::Slot& slot = s.slots[count_ % s.slots.size()];
  if (slot.pending) {
    absl::Status st =
        Wait(slot.done, absl::StrCat("message ", count_ - s.slots.size(), " to be received"));
    if (!st.ok()) return st;
    slot.pending = false;
  }
  s.buffer_taken = true;
  return slot.features;
}

absl::Status NcclChannel::Send(uint64_t batch_id, absl::Span<const uint8_t> message,
                               size_t feature_bytes) {
  State& s = *state_;
  if (!s.buffer_taken) {
    return absl::FailedPreconditionError("nccl channel: Send without NextFeatureBuffer");
  }
  if (message.size() > max_message_bytes_ || feature_bytes > max_feature_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl channel: batch ", batch_id, ": a message of ", message.size(),
                     " bytes and ", feature_bytes, " bytes of features exceed the channel's ",
                     max_message_bytes_, " and ", max_feature_bytes_));
  }
  if (absl::Status st = EnsureInitialized(); !st.ok()) return st;
  State::Slot& slot = s.slots[count_ % s.slots.size()];
  const uint64_t head[2] = {batch_id, message.size()};
  std::memcpy(slot.frame_host, head, kFrameHead);
  std::memcpy(slot.frame_host + kFrameHead, message.data(), message.size());
  // The features were written by work on the default stream (LibTorch's): wait for it there.
  cudaError_t e = cudaEventRecord(slot.produced, nullptr);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s.stream, slot.produced, 0);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(slot.frame_dev, slot.frame_host, kFrameHead + message.size(),
                        cudaMemcpyHostToDevice, s.stream);
  }
  if (e != cudaSuccess) return Fail(s.core->Cuda(e, absl::StrCat("queueing batch ", batch_id)));
  // A non-blocking communicator's call may still be in progress when it returns: each one is
  // waited for (queued, not transferred) before the next.
  const std::string what = absl::StrCat("queueing batch ", batch_id);
  for (const auto& [buffer, bytes] : {std::make_pair(slot.frame_dev, s.frame_bytes),
                                      std::make_pair(slot.features, feature_bytes)}) {
    if (bytes == 0) continue;
    if (absl::Status st =
            s.core->Queued(ncclSend(buffer, bytes, ncclUint8, 1, s.core->comm(), s.stream),
                           absl::StrCat("ncclSend of batch ", batch_id));
        !st.ok()) {
      return st;
    }
    if (absl::Status st = Wait(nullptr, what); !st.ok()) return st;
  }
  if (e = cudaEventRecord(slot.done, s.stream); e != cudaSuccess) {
    return Fail(s.core->Cuda(e, "recording the transfer"));
  }
  slot.pending = true;
  s.buffer_taken = false;
  ++count_;
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const uint8_t>> NcclChannel::ReceiveFrame(uint64_t expected_batch_id) {
  if (options_.rank != 1) return absl::FailedPreconditionError("nccl channel: not the receiver");
  if (absl::Status st = EnsureInitialized(); !st.ok()) return st;
  State& s = *state_;
  if (s.receiving >= 0) {
    return absl::FailedPreconditionError("nccl channel: the previous message was not released");
  }
  const int index = static_cast<int>(count_ % s.slots.size());
  State::Slot& slot = s.slots[index];
  cudaError_t e = cudaSuccess;
  // The buffers are reused only once the work that read them (queued before Release) has run.
  if (slot.consumed_recorded) e = cudaStreamWaitEvent(s.stream, slot.consumed, 0);
  if (e != cudaSuccess) return Fail(s.core->Cuda(e, "ordering the receive"));
  if (absl::Status st = s.core->Queued(
          ncclRecv(slot.frame_dev, s.frame_bytes, ncclUint8, 0, s.core->comm(), s.stream),
          "ncclRecv of a frame");
      !st.ok()) {
    return st;
  }
  const std::string what = absl::StrCat("batch ", expected_batch_id);
  if (absl::Status st = Wait(nullptr, what); !st.ok()) return st;
  e = cudaMemcpyAsync(slot.frame_host, slot.frame_dev, s.frame_bytes, cudaMemcpyDeviceToHost,
                      s.stream);
  if (e == cudaSuccess) e = cudaEventRecord(slot.done, s.stream);
  if (e != cudaSuccess) return Fail(s.core->Cuda(e, "copying a frame"));
  if (absl::Status st = Wait(slot.done, what); !st.ok()) return st;
  uint64_t head[2];
  std::memcpy(head, slot.frame_host, kFrameHead);
  if (head[1] > max_message_bytes_) {
    return Fail(
        absl::DataLossError(absl::StrCat("nccl channel: batch ", head[0], ": a frame of ", head[1],
                                         " bytes, more than the channel's ", max_message_bytes_)));
  }
  if (head[0] != expected_batch_id) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("nccl channel: received batch ", head[0], " where batch ", expected_batch_id,
                     " was expected; the channel is aborted")));
  }
  s.receiving = index;
  return absl::Span<const uint8_t>(slot.frame_host + kFrameHead, head[1]);
}

absl::StatusOr<const void*> NcclChannel::ReceiveFeatures(size_t feature_bytes) {
  State& s = *state_;
  if (s.receiving < 0) return absl::FailedPreconditionError("nccl channel: no frame received");
  if (feature_bytes > max_feature_bytes_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("nccl channel: ", feature_bytes,
                                                        " bytes of features, more than the "
                                                        "channel's ",
                                                        max_feature_bytes_)));
  }
  if (absl::Status st = EnsureInitialized(); !st.ok()) return st;
  State::Slot& slot = s.slots[s.receiving];
  if (feature_bytes > 0) {
    if (absl::Status st = s.core->Queued(
            ncclRecv(slot.features, feature_bytes, ncclUint8, 0, s.core->comm(), s.stream),
            "ncclRecv of features");
        !st.ok()) {
      return st;
    }
    if (absl::Status st = Wait(nullptr, "features"); !st.ok()) return st;
    if (cudaError_t e = cudaEventRecord(slot.done, s.stream); e != cudaSuccess) {
      return Fail(s.core->Cuda(e, "recording the transfer"));
    }
    if (absl::Status st = Wait(slot.done, "features"); !st.ok()) return st;
  }
  return static_cast<const void*>(slot.features);
}

absl::Status NcclChannel::Release() {
  State& s = *state_;
  if (s.receiving < 0) return absl::FailedPreconditionError("nccl channel: nothing to release");
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return s.core->Cuda(e, "cudaSetDevice");
  }
  State::Slot& slot = s.slots[s.receiving];
  if (cudaError_t e = cudaEventRecord(slot.consumed, nullptr); e != cudaSuccess) {
    return Fail(s.core->Cuda(e, "recording the release"));
  }
  slot.consumed_recorded = true;
  s.receiving = -1;
  ++count_;
  return absl::OkStatus();
}

void NcclChannel::Abort() { abort_requested_.store(true); }

#else  // !DFLASH_HAVE_NCCL

struct NcclChannel::State {};

namespace {
absl::Status NoNccl() {
  return absl::UnimplementedError("this build has no NCCL (built without CUDA)");
}
}  // namespace

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Create(const std::string&,
                                                                 const Options&) {
  return NoNccl();
}
absl::StatusOr<std::string> NcclChannel::NewDescriptor(size_t, size_t) { return NoNccl(); }
NcclChannel::NcclChannel(std::string unique_id, Options options, size_t, size_t)
    : unique_id_(std::move(unique_id)), options_(options) {}
NcclChannel::~NcclChannel() = default;
absl::StatusOr<void*> NcclChannel::NextFeatureBuffer() { return NoNccl(); }
absl::Status NcclChannel::Send(uint64_t, absl::Span<const uint8_t>, size_t) { return NoNccl(); }
absl::StatusOr<absl::Span<const uint8_t>> NcclChannel::ReceiveFrame(uint64_t) { return NoNccl(); }
absl::StatusOr<const void*> NcclChannel::ReceiveFeatures(size_t) { return NoNccl(); }
absl::Status NcclChannel::Release() { return NoNccl(); }
void NcclChannel::Abort() {}

#endif  // DFLASH_HAVE_NCCL

}  // namespace dflash::transport

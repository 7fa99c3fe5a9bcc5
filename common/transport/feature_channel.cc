#include "common/transport/feature_channel.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/transport/cuda_ipc.h"
#include "common/transport/feature_checksum.h"
#include "common/transport/nccl_channel.h"
#include "common/transport/shm_ring.h"
#include "common/transport/shm_segment.h"

namespace dflash::transport {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status Annotated(const absl::Status& s, const std::string& prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

size_t FeatureBytes(const batching::PackedBatch& batch, int64_t feature_dim, FeatureDType dtype) {
  return batch.input_ids.size() * static_cast<size_t>(feature_dim) * FeatureDTypeSize(dtype);
}

// ---- senders ----

// Device transports: the features' checksum, the test executables' hook, the message naming them.
class DeviceSender : public FeatureSender {
 protected:
  explicit DeviceSender(FeatureChannelOptions o) : o_(std::move(o)) {}

  absl::Status Init() {
    absl::StatusOr<std::unique_ptr<DeviceChecksummer>> c = DeviceChecksummer::Create(o_.gpu);
    if (!c.ok()) return c.status();
    checksummer_ = *std::move(c);
    return absl::OkStatus();
  }

  // Waits for the forward that wrote `features` (the checksum is queued behind it) and encodes
  // the message with `ref` completed by the checksum.
  absl::StatusOr<uint32_t> Seal(const batching::PackedBatch& batch, void* features,
                                DeviceFeatureRef ref) {
    const size_t bytes = FeatureBytes(batch, o_.feature_dim, o_.dtype);
    absl::StatusOr<FeatureChecksum> sum = checksummer_->Compute(features, bytes);
    if (!sum.ok()) return sum.status();
    ref.checksum_sum = sum->sum;
    ref.checksum_weighted = sum->weighted;
    if (o_.after_checksum) o_.after_checksum(features, bytes, sent_);
    return EncodeFeatureMessageRef(batch, o_.feature_dim, o_.dtype, ref, &message_);
  }

  FeatureChannelOptions o_;
  std::unique_ptr<DeviceChecksummer> checksummer_;
  std::vector<uint8_t> message_;
  uint64_t sent_ = 0;
};

// host and cuda_ipc: the shared-memory ring (cuda_ipc: with one device buffer per slot; the
// ring's order guarantees that the receiver has handed a slot back before it is written again).
class RingSender : public DeviceSender {
 public:
  static absl::StatusOr<std::unique_ptr<FeatureSender>> Make(const FeatureChannelOptions& o) {
    std::unique_ptr<RingSender> s(new RingSender(o));
    if (absl::Status st = s->Open(); !st.ok()) return st;
    return s;
  }
  Transport transport() const override { return o_.transport; }
  std::string handoff() const override { return o_.name; }
  std::string Describe() const override {
    return absl::StrCat(o_.name, " (", TransportName(o_.transport), ", ", o_.slots, " x ",
                        slot_bytes_, " bytes", stale_ ? "; replaced a stale one" : "", ")");
  }

  absl::StatusOr<void*> NextBuffer() override {
    if (!slots_) return nullptr;
    if (absl::Status s = ring_->WaitFree(o_.timeout); !s.ok()) {
      if (s.code() == absl::StatusCode::kDeadlineExceeded) ring_->Abort();
      return s;
    }
    return slots_->slot(static_cast<uint32_t>(sent_ % slots_->size()));
  }

  absl::StatusOr<uint32_t> Send(uint64_t batch_id, const batching::PackedBatch& batch,
                                const void* features, int64_t* bytes_sent) override {
    absl::StatusOr<uint32_t> crc;
    int64_t bytes = 0;
    if (slots_) {
      DeviceFeatureRef ref;
      ref.ipc_handle = slots_->handle(static_cast<uint32_t>(sent_ % slots_->size()));
      crc = Seal(batch, const_cast<void*>(features), ref);
      // Published only once written: the receiver reads the slot as soon as the message arrives.
      if (crc.ok()) {
        if (absl::Status s = SynchronizeDevice(o_.gpu); !s.ok()) return s;
      }
      bytes = static_cast<int64_t>(FeatureBytes(batch, o_.feature_dim, o_.dtype));
    } else {
      crc = EncodeFeatureMessage(batch, features, o_.feature_dim, o_.dtype, &message_);
      if (crc.ok() && o_.after_checksum) o_.after_checksum(message_.data(), message_.size(), sent_);
    }
    if (!crc.ok()) return crc.status();
    if (absl::Status s = ring_->Send(batch_id, message_, o_.timeout); !s.ok()) {
      if (s.code() == absl::StatusCode::kDeadlineExceeded) ring_->Abort();
      return s;
    }
    ++sent_;
    if (bytes_sent != nullptr) *bytes_sent = bytes + static_cast<int64_t>(message_.size());
    return crc;
  }

  int64_t Depth() const override { return static_cast<int64_t>(ring_->Depth()); }
  void Abort() override { ring_->Abort(); }

 private:
  explicit RingSender(const FeatureChannelOptions& o) : DeviceSender(o) {}

  absl::Status Open() {
    const bool device = o_.transport == Transport::kCudaIpc;
    if (device) {
      if (absl::Status s = Init(); !s.ok()) return s;
      absl::StatusOr<std::unique_ptr<CudaIpcSlots>> slots = CudaIpcSlots::Create(
          o_.gpu, o_.slots,
          static_cast<size_t>(o_.max_tokens * o_.feature_dim) * FeatureDTypeSize(o_.dtype));
      if (!slots.ok()) return slots.status();
      slots_ = *std::move(slots);
    }
    ShmRing::Options ro;
    ro.slots = o_.slots;
    ro.slot_bytes = slot_bytes_ = MaxFeatureMessageBytes(o_.max_tokens, o_.feature_dim, o_.dtype,
                                                         /*inline_features=*/!device);
    // A ring of this name left behind by a crashed attempt is stale: names are per attempt.
    stale_ = ShmSegment::Unlink(o_.name);
    absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Create(o_.name, ro);
    if (!ring.ok()) return ring.status();
    ring_ = *std::move(ring);
    return absl::OkStatus();
  }

  std::unique_ptr<ShmRing> ring_;
  std::unique_ptr<CudaIpcSlots> slots_;  // cuda_ipc only
  size_t slot_bytes_ = 0;
  bool stale_ = false;
};

class NcclSender : public DeviceSender {
 public:
  static absl::StatusOr<std::unique_ptr<FeatureSender>> Make(const FeatureChannelOptions& o) {
    std::unique_ptr<NcclSender> s(new NcclSender(o));
    if (absl::Status st = s->Init(); !st.ok()) return st;
    const size_t message_bytes =
        MaxFeatureMessageBytes(o.max_tokens, o.feature_dim, o.dtype, /*inline_features=*/false);
    s->feature_bytes_ =
        static_cast<size_t>(o.max_tokens * o.feature_dim) * FeatureDTypeSize(o.dtype);
    absl::StatusOr<std::string> descriptor =
        NcclChannel::NewDescriptor(message_bytes, s->feature_bytes_);
    if (!descriptor.ok()) return descriptor.status();
    NcclChannel::Options co;
    co.rank = 0;
    co.device = o.gpu;
    co.slots = o.slots;
    co.timeout = o.timeout;
    absl::StatusOr<std::unique_ptr<NcclChannel>> channel = NcclChannel::Create(*descriptor, co);
    if (!channel.ok()) return channel.status();
    s->channel_ = *std::move(channel);
    s->descriptor_ = *std::move(descriptor);
    return s;
  }
  Transport transport() const override { return Transport::kNccl; }
  std::string handoff() const override { return descriptor_; }
  std::string Describe() const override {
    return absl::StrCat("nccl (", o_.slots, " x ", feature_bytes_, " bytes)");
  }
  absl::StatusOr<void*> NextBuffer() override { return channel_->NextFeatureBuffer(); }

  absl::StatusOr<uint32_t> Send(uint64_t batch_id, const batching::PackedBatch& batch,
                                const void* features, int64_t* bytes_sent) override {
    // No handle: the features follow the message; the transfer waits for the forward on the
    // device.
    absl::StatusOr<uint32_t> crc = Seal(batch, const_cast<void*>(features), DeviceFeatureRef{});
    if (!crc.ok()) return crc.status();
    const size_t bytes = FeatureBytes(batch, o_.feature_dim, o_.dtype);
    if (absl::Status s = channel_->Send(batch_id, message_, bytes); !s.ok()) return s;
    ++sent_;
    if (bytes_sent != nullptr) *bytes_sent = static_cast<int64_t>(bytes + message_.size());
    return crc;
  }
  void Abort() override { channel_->Abort(); }

 private:
  explicit NcclSender(const FeatureChannelOptions& o) : DeviceSender(o) {}
  std::unique_ptr<NcclChannel> channel_;
  std::string descriptor_;
  size_t feature_bytes_ = 0;
};

// ---- receivers ----

// Decoding, locating and checking a message's features, whichever way they travelled.
class ReceiverBase : public FeatureReceiver {
 protected:
  explicit ReceiverBase(FeatureChannelOptions o) : o_(std::move(o)) {}

  absl::Status Init() {
    if (!DeviceFeatures(o_.transport)) return absl::OkStatus();
    if (o_.transport == Transport::kCudaIpc) mappings_ = std::make_unique<CudaIpcMappings>(o_.gpu);
    absl::StatusOr<std::unique_ptr<DeviceChecksummer>> c = DeviceChecksummer::Create(o_.gpu);
    if (!c.ok()) return c.status();
    checksummer_ = *std::move(c);
    return absl::OkStatus();
  }

  absl::StatusOr<ReceivedFeatures> Decode(uint64_t batch_id, absl::Span<const uint8_t> message) {
    const std::string prefix = absl::StrCat("batch ", batch_id, ": ");
    absl::StatusOr<DecodedFeatures> d = DecodeFeatureMessage(message);
    if (!d.ok()) return Annotated(d.status(), prefix);
    ReceivedFeatures r;
    r.decoded = *std::move(d);
    r.bytes = static_cast<int64_t>(message.size());
    if (!r.decoded.device) {
      if (r.decoded.features == nullptr) {
        return absl::FailedPreconditionError(prefix + "no features in the message");
      }
      r.data = r.decoded.features;
      return r;
    }
    r.on_device = true;
    if (absl::Status s = Locate(batch_id, &r); !s.ok()) return s;
    // Never handed out when they differ from what the sender wrote (feature_checksum.h).
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<FeatureChecksum> sum = checksummer_->Compute(
        r.data, FeatureBytes(r.decoded.batch, r.decoded.feature_dim, r.decoded.dtype));
    if (!sum.ok()) return sum.status();
    r.checksum_seconds = SecondsSince(start);
    const FeatureChecksum sent{r.decoded.device->checksum_sum, r.decoded.device->checksum_weighted};
    if (*sum != sent) {
      return absl::DataLossError(absl::StrCat(
          prefix, "the features' checksum (", absl::Hex(sum->sum), ", ", absl::Hex(sum->weighted),
          ") is not the target's (", absl::Hex(sent.sum), ", ", absl::Hex(sent.weighted),
          "): corrupted between the target and this drafter over ", TransportName(o_.transport),
          "; not trained on"));
    }
    return r;
  }

  // Sets r->data to the device features of a message that names them (r->decoded.device).
  virtual absl::Status Locate(uint64_t batch_id, ReceivedFeatures* r) = 0;

  FeatureChannelOptions o_;
  std::unique_ptr<CudaIpcMappings> mappings_;  // cuda_ipc
  std::unique_ptr<DeviceChecksummer> checksummer_;
};

class RingReceiver : public ReceiverBase {
 public:
  static absl::StatusOr<std::unique_ptr<FeatureReceiver>> Make(const FeatureChannelOptions& o) {
    std::unique_ptr<RingReceiver> r(new RingReceiver(o));
    if (absl::Status s = r->Init(); !s.ok()) return s;
    return r;
  }
  Transport transport() const override { return o_.transport; }

  absl::StatusOr<ReceivedFeatures> Receive(uint64_t batch_id) override {
    if (absl::Status s = OpenRing(); !s.ok()) return s;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<absl::Span<const uint8_t>> message = ring_->Receive(batch_id, o_.timeout);
    const double waited = SecondsSince(start);
    if (!message.ok()) {
      if (message.status().code() != absl::StatusCode::kAborted) ring_->Abort();
      return Annotated(message.status(), absl::StrCat("receiving batch ", batch_id, ": "));
    }
    absl::StatusOr<ReceivedFeatures> r = Decode(batch_id, *message);
    if (r.ok()) r->wait_seconds = waited;
    return r;
  }

  absl::Status Release() override {
    // cuda_ipc: the slot is the sender's to write again once the work reading it has finished.
    if (!ring_) return absl::FailedPreconditionError("feature channel: nothing to release");
    if (mappings_) {
      if (absl::Status s = SynchronizeDevice(o_.gpu); !s.ok()) return s;
    }
    return ring_->Release();
  }
  int64_t Depth() const override { return ring_ ? static_cast<int64_t>(ring_->Depth()) : 0; }
  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    if (ring_) ring_->Abort();
  }

 private:
  explicit RingReceiver(const FeatureChannelOptions& o) : ReceiverBase(o) {}

  absl::Status OpenRing() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ring_) return absl::OkStatus();
      if (aborted_) return absl::AbortedError("the channel was aborted");
    }
    absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Open(o_.name, o_.open_timeout);
    if (!ring.ok()) return ring.status();
    std::lock_guard<std::mutex> lock(mu_);
    ring_ = *std::move(ring);
    if (aborted_) ring_->Abort();
    return absl::OkStatus();
  }

  absl::Status Locate(uint64_t batch_id, ReceivedFeatures* r) override {
    if (!mappings_) {
      return absl::FailedPreconditionError(
          absl::StrCat("batch ", batch_id, ": device features on a host channel"));
    }
    absl::StatusOr<void*> base = mappings_->Open(r->decoded.device->ipc_handle);
    if (!base.ok()) return base.status();
    r->data = static_cast<const uint8_t*>(*base) + r->decoded.device->offset;
    return absl::OkStatus();
  }

  std::mutex mu_;  // ring_ and aborted_: Abort comes from another thread
  std::unique_ptr<ShmRing> ring_;
  bool aborted_ = false;
};

class NcclReceiver : public ReceiverBase {
 public:
  static absl::StatusOr<std::unique_ptr<FeatureReceiver>> Make(const FeatureChannelOptions& o) {
    std::unique_ptr<NcclReceiver> r(new NcclReceiver(o));
    if (absl::Status s = r->Init(); !s.ok()) return s;
    NcclChannel::Options co;
    co.rank = 1;
    co.device = o.gpu;
    co.slots = o.slots;
    co.timeout = o.timeout;
    absl::StatusOr<std::unique_ptr<NcclChannel>> channel = NcclChannel::Create(o.name, co);
    if (!channel.ok()) return channel.status();
    r->channel_ = *std::move(channel);
    return r;
  }
  Transport transport() const override { return Transport::kNccl; }

  absl::StatusOr<ReceivedFeatures> Receive(uint64_t batch_id) override {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<absl::Span<const uint8_t>> message = channel_->ReceiveFrame(batch_id);
    const double waited = SecondsSince(start);
    if (!message.ok()) {
      return Annotated(message.status(), absl::StrCat("receiving batch ", batch_id, ": "));
    }
    absl::StatusOr<ReceivedFeatures> r = Decode(batch_id, *message);
    if (r.ok()) r->wait_seconds += waited;
    return r;
  }
  absl::Status Release() override { return channel_->Release(); }
  void Abort() override { channel_->Abort(); }

 private:
  explicit NcclReceiver(const FeatureChannelOptions& o) : ReceiverBase(o) {}

  // The features follow the message into the channel's buffer, valid until Release (which orders
  // the buffer's reuse after the work queued on it).
  absl::Status Locate(uint64_t batch_id, ReceivedFeatures* r) override {
    const size_t bytes = FeatureBytes(r->decoded.batch, r->decoded.feature_dim, r->decoded.dtype);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<const void*> base = channel_->ReceiveFeatures(bytes);
    r->wait_seconds = SecondsSince(start);
    if (!base.ok()) return Annotated(base.status(), absl::StrCat("batch ", batch_id, ": "));
    r->data = *base;
    r->bytes += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }

  std::unique_ptr<NcclChannel> channel_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FeatureSender>> FeatureSender::Create(
    const FeatureChannelOptions& o) {
  if (absl::Status s = CheckTransportDevice(o.transport, o.gpu); !s.ok()) return s;
  if (o.max_tokens < 1 || o.feature_dim < 1 || o.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("feature channel: max_tokens (", o.max_tokens,
                                                   "), feature_dim (", o.feature_dim,
                                                   ") and slots (", o.slots, ") must be positive"));
  }
  if (o.transport == Transport::kNccl) return NcclSender::Make(o);
  return RingSender::Make(o);
}

absl::StatusOr<std::unique_ptr<FeatureReceiver>> FeatureReceiver::Create(
    const FeatureChannelOptions& o) {
  if (absl::Status s = CheckTransportDevice(o.transport, o.gpu); !s.ok()) return s;
  if (o.transport == Transport::kNccl) return NcclReceiver::Make(o);
  return RingReceiver::Make(o);
}

}  // namespace dflash::transport

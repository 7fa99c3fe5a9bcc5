#include "common/transport/shm_ring.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dflash::transport {

namespace {

constexpr uint64_t kMagic = 0x31474e4952464c44ull;  // "DLFRING1"
constexpr uint32_t kEmpty = 0, kFull = 1;
constexpr size_t kAlign = 64;
constexpr char kWhat[] = "shm ring";

size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

struct ShmRing::Header {
  uint64_t magic;  // first: ShmSegment publishes it
  uint32_t slots;
  uint32_t reserved;
  uint64_t slot_bytes;
  std::atomic<uint32_t> aborted;
};

struct ShmRing::Slot {
  std::atomic<uint32_t> state;  // kEmpty / kFull: the futex word
  uint32_t reserved;
  uint64_t batch_id;
  uint64_t nbytes;
  // payload follows at offset RoundUp(sizeof(Slot))
};

namespace {
size_t SlotStride(uint64_t slot_bytes) {
  return RoundUp(sizeof(uint64_t) * 3) + RoundUp(static_cast<size_t>(slot_bytes));
}
}  // namespace

ShmRing::Slot* ShmRing::slot(uint64_t index) const {
  const size_t i = static_cast<size_t>(index % header_->slots);
  auto* first = static_cast<uint8_t*>(segment_->base()) + RoundUp(sizeof(Header));
  return reinterpret_cast<Slot*>(first + i * SlotStride(header_->slot_bytes));
}

size_t ShmRing::slot_bytes() const { return static_cast<size_t>(header_->slot_bytes); }

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Create(const std::string& name,
                                                         const Options& options) {
  if (options.slots < 1 || options.slot_bytes < 1) {
    return absl::InvalidArgumentError("shm ring: slots and slot_bytes must be at least 1");
  }
  const size_t size = RoundUp(sizeof(Header)) + options.slots * SlotStride(options.slot_bytes);
  absl::StatusOr<std::unique_ptr<ShmSegment>> segment = ShmSegment::Create(kWhat, name, size);
  if (!segment.ok()) return segment.status();
  std::unique_ptr<ShmRing> ring(new ShmRing());
  ring->name_ = name;
  ring->segment_ = *std::move(segment);
  ring->header_ = static_cast<Header*>(ring->segment_->base());  // zero-filled
  ring->header_->slots = options.slots;
  ring->header_->slot_bytes = options.slot_bytes;
  ring->header_->aborted.store(0, std::memory_order_relaxed);
  ring->segment_->Publish(kMagic);  // last: Open waits for it
  return ring;
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Open(const std::string& name,
                                                       absl::Duration deadline) {
  absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
      ShmSegment::Open(kWhat, name, kMagic, deadline);
  if (!segment.ok()) return segment.status();
  if ((*segment)->size() < RoundUp(sizeof(Header))) {
    return absl::DataLossError(
        absl::StrCat("shm ring ", name, ": segment smaller than its header"));
  }
  std::unique_ptr<ShmRing> ring(new ShmRing());
  ring->name_ = name;
  ring->segment_ = *std::move(segment);
  ring->header_ = static_cast<Header*>(ring->segment_->base());
  return ring;
}

ShmRing::~ShmRing() = default;

absl::Status ShmRing::WaitState(Slot* s, uint32_t want, absl::Time deadline,
                                const char* what) const {
  for (;;) {
    if (header_->aborted.load(std::memory_order_acquire) != 0) {
      return absl::AbortedError(absl::StrCat("shm ring ", name_, " aborted while ", what));
    }
    const uint32_t cur = s->state.load(std::memory_order_acquire);
    if (cur == want) return absl::OkStatus();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("shm ring ", name_, ": ", what));
    }
    // Sleeps only while the word still holds `cur`; Abort() and the peer wake it.
    FutexWait(&s->state, cur, std::min(left, absl::Milliseconds(100)));
  }
}

absl::Status ShmRing::Send(uint64_t batch_id, absl::Span<const uint8_t> payload,
                           absl::Duration timeout) {
  if (payload.size() > header_->slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shm ring ", name_, ": batch ", batch_id,
                                                   " has ", payload.size(), " bytes, a slot holds ",
                                                   header_->slot_bytes));
  }
  Slot* s = slot(next_);
  const std::string what = absl::StrCat("waiting for a free slot for batch ", batch_id);
  if (absl::Status st = WaitState(s, kEmpty, absl::Now() + timeout, what.c_str()); !st.ok()) {
    return st;
  }
  uint8_t* data = reinterpret_cast<uint8_t*>(s) + RoundUp(sizeof(uint64_t) * 3);
  if (!payload.empty()) std::memcpy(data, payload.data(), payload.size());
  s->batch_id = batch_id;
  s->nbytes = payload.size();
  s->state.store(kFull, std::memory_order_release);
  FutexWakeAll(&s->state);
  ++next_;
  return absl::OkStatus();
}

uint32_t ShmRing::Depth() const {
  uint32_t full = 0;
  for (uint32_t i = 0; i < header_->slots; ++i) {
    full += slot(i)->state.load(std::memory_order_acquire) == kFull ? 1 : 0;
  }
  return full;
}

absl::Status ShmRing::WaitFree(absl::Duration timeout) {
  return WaitState(slot(next_), kEmpty, absl::Now() + timeout, "waiting for a free slot");
}

absl::StatusOr<absl::Span<const uint8_t>> ShmRing::Receive(uint64_t expected_batch_id,
                                                           absl::Duration timeout) {
  if (holding_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm ring ", name_, ": Receive before releasing the previous batch"));
  }
  Slot* s = slot(next_);
  const std::string what = absl::StrCat("waiting for batch ", expected_batch_id);
  if (absl::Status st = WaitState(s, kFull, absl::Now() + timeout, what.c_str()); !st.ok()) {
    return st;
  }
  if (s->batch_id != expected_batch_id) {
    return absl::FailedPreconditionError(absl::StrCat("shm ring ", name_, ": expected batch ",
                                                      expected_batch_id, ", received batch ",
                                                      s->batch_id, "; not consumed"));
  }
  holding_ = true;
  const uint8_t* data = reinterpret_cast<const uint8_t*>(s) + RoundUp(sizeof(uint64_t) * 3);
  return absl::Span<const uint8_t>(data, static_cast<size_t>(s->nbytes));
}

absl::Status ShmRing::Release() {
  if (!holding_) {
    return absl::FailedPreconditionError(absl::StrCat("shm ring ", name_, ": nothing received"));
  }
  Slot* s = slot(next_);
  s->state.store(kEmpty, std::memory_order_release);
  FutexWakeAll(&s->state);
  holding_ = false;
  ++next_;
  return absl::OkStatus();
}

void ShmRing::Abort() {
  header_->aborted.store(1, std::memory_order_release);
  for (uint32_t i = 0; i < header_->slots; ++i) FutexWakeAll(&slot(i)->state);
}

}  // namespace dflash::transport

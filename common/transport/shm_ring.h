// The `host` feature transport (architecture.md, "Transports"): a single-producer single-consumer
// ring of fixed-size slots in POSIX shared memory, between a target worker (producer) and its
// paired drafter worker (consumer) on one machine without GPUs. Every slot carries the batch id
// it holds; the receiver names the batch id it expects and refuses another one (never trains on
// the wrong features). Every wait has a deadline (DEADLINE_EXCEEDED) and either side can abort the
// ring, which wakes the other side's waits with ABORTED. Waits sleep on a futex in the shared
// page, not in a polling loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/transport/shm_segment.h"

namespace dflash::transport {

class ShmRing {
 public:
  struct Options {
    uint32_t slots = 2;     // batches in flight (the producer's run-ahead bound)
    size_t slot_bytes = 0;  // largest payload
  };

  // Producer side: creates /dev/shm/<name> (name: letters, digits, '-', '_', '.'), refusing an
  // existing one (ALREADY_EXISTS); the name is unlinked when the producer's ring is destroyed.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Create(const std::string& name,
                                                         const Options& options);
  // Consumer side: opens a ring created by Create, waiting up to `deadline` for it to appear.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Open(const std::string& name,
                                                       absl::Duration deadline);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Producer: waits (up to `timeout`) for the next slot to be free, copies `payload` into it and
  // publishes it under `batch_id`. INVALID_ARGUMENT when the payload is larger than a slot.
  absl::Status Send(uint64_t batch_id, absl::Span<const uint8_t> payload, absl::Duration timeout);

  // Producer: waits (up to `timeout`) until the slot the next Send fills is free, i.e. the consumer
  // has released what it held there. A producer whose payload lives outside the ring (cuda_ipc:
  // one device buffer per slot) calls this before writing that slot's buffer.
  absl::Status WaitFree(absl::Duration timeout);

  // Consumer: waits (up to `timeout`) for the next slot. When it holds `expected_batch_id`, returns
  // its payload, valid until Release(); otherwise FAILED_PRECONDITION naming both ids, and the slot
  // stays unconsumed (the pair is out of step: the caller aborts the run).
  absl::StatusOr<absl::Span<const uint8_t>> Receive(uint64_t expected_batch_id,
                                                    absl::Duration timeout);
  // Consumer: hands the slot returned by Receive back to the producer.
  absl::Status Release();

  // Either side: marks the ring aborted; every current and later wait returns ABORTED.
  void Abort();

  // Slots holding a batch not yet released by the consumer (0..slots), as of now.
  uint32_t Depth() const;

  const std::string& name() const { return name_; }
  size_t slot_bytes() const;

 private:
  struct Header;
  struct Slot;
  ShmRing() = default;
  Slot* slot(uint64_t index) const;
  absl::Status WaitState(Slot* s, uint32_t want, absl::Time deadline, const char* what) const;

  std::string name_;
  std::unique_ptr<ShmSegment> segment_;
  Header* header_ = nullptr;
  uint64_t next_ = 0;     // producer: next slot to fill; consumer: next slot to read
  bool holding_ = false;  // consumer: a received slot not yet released
};

}  // namespace dflash::transport

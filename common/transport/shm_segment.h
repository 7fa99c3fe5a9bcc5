// A named POSIX shared-memory segment between processes of one machine (/dev/shm/<name>), and
// futex waits on words inside it. The creator sizes it (zero-filled) and publishes a magic number
// in its first 8 bytes when its header is written; openers wait (bounded) for that magic, so they
// never read a half-initialized header. Used by the host feature ring (shm_ring.h) and the host
// communicator among data-parallel drafters (host_communicator.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dflash::transport {

class ShmSegment {
 public:
  // Creates /dev/shm/<name> (letters, digits, '-', '_', '.') of `size` bytes, zero-filled,
  // refusing an existing one (ALREADY_EXISTS). The creator unlinks the name when destroyed.
  // `what` names the user in error messages ("shm ring", "host communicator").
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& what,
                                                            const std::string& name, size_t size);
  // Opens a segment made by Create, waiting up to `deadline` for it to appear with `magic`
  // published (DEADLINE_EXCEEDED naming it otherwise).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& what,
                                                          const std::string& name, uint64_t magic,
                                                          absl::Duration deadline);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Removes /dev/shm/<name> if it exists (a segment left by a crashed process); true if removed.
  static bool Unlink(const std::string& name);

  // Creator: makes the segment visible to Open (release store of `magic` at offset 0), after
  // everything else in the header is written.
  void Publish(uint64_t magic);

  void* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment() = default;
  std::string name_;
  bool owner_ = false;
  void* base_ = nullptr;
  size_t size_ = 0;
};

// Sleeps while *word == expected, at most `max` (futex(2) on a shared mapping, so the waker may
// be another process). Returns early on a wake-up or a spurious wake; callers re-check.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration max);
// Wakes every waiter on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace dflash::transport

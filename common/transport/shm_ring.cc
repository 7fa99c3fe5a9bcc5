#include "common/transport/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dflash::transport {

namespace {

constexpr uint64_t kMagic = 0x31474e4952464c44ull;  // "DLFRING1"
constexpr uint32_t kEmpty = 0, kFull = 1;
constexpr size_t kAlign = 64;

size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 200) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

// futex(2) on a word of the shared mapping (not FUTEX_PRIVATE: the waker is another process).
long Futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

}  // namespace

struct ShmRing::Header {
  uint64_t magic;
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

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");

namespace {
size_t SlotStride(uint64_t slot_bytes) {
  return RoundUp(sizeof(uint64_t) * 3) + RoundUp(static_cast<size_t>(slot_bytes));
}
}  // namespace

ShmRing::Slot* ShmRing::slot(uint64_t index) const {
  const size_t i = static_cast<size_t>(index % header_->slots);
  auto* first = static_cast<uint8_t*>(base_) + RoundUp(sizeof(Header));
  return reinterpret_cast<Slot*>(first + i * SlotStride(header_->slot_bytes));
}

size_t ShmRing::slot_bytes() const { return static_cast<size_t>(header_->slot_bytes); }

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Create(const std::string& name,
                                                         const Options& options) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("shm ring: bad name '", name, "'"));
  }
  if (options.slots < 1 || options.slot_bytes < 1) {
    return absl::InvalidArgumentError("shm ring: slots and slot_bytes must be at least 1");
  }
  const size_t size = RoundUp(sizeof(Header)) + options.slots * SlotStride(options.slot_bytes);
  const std::string path = "/" + name;
  const int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const int e = errno;
    return e == EEXIST ? absl::AlreadyExistsError(absl::StrCat("shm ring ", name, " exists"))
                       : absl::InternalError(absl::StrCat("shm_open ", name, ": ", strerror(e)));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(path.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shm ring ", name, ": cannot size to ", size, " bytes: ", strerror(e)));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(path.c_str());
    return absl::InternalError(absl::StrCat("mmap shm ring ", name, ": ", strerror(errno)));
  }
  std::unique_ptr<ShmRing> ring(new ShmRing());
  ring->name_ = name;
  ring->owner_ = true;
  ring->base_ = base;
  ring->size_ = size;
  ring->header_ = static_cast<Header*>(base);  // the fresh mapping is zero-filled
  ring->header_->slots = options.slots;
  ring->header_->slot_bytes = options.slot_bytes;
  ring->header_->aborted.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&ring->header_->magic)
      ->store(kMagic, std::memory_order_release);  // published last: Open waits for it
  return ring;
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Open(const std::string& name,
                                                       absl::Duration deadline) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("shm ring: bad name '", name, "'"));
  }
  const absl::Time until = absl::Now() + deadline;
  const std::string path = "/" + name;
  absl::Duration backoff = absl::Microseconds(100);
  for (;;) {
    const int fd = shm_open(path.c_str(), O_RDWR, 0);
    if (fd >= 0) {
      struct stat st {};
      if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(Header)) {
        void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE,
                          MAP_SHARED, fd, 0);
        close(fd);
        if (base == MAP_FAILED) {
          return absl::InternalError(absl::StrCat("mmap shm ring ", name, ": ", strerror(errno)));
        }
        auto* header = static_cast<Header*>(base);
        if (reinterpret_cast<std::atomic<uint64_t>*>(&header->magic)
                ->load(std::memory_order_acquire) == kMagic) {
          std::unique_ptr<ShmRing> ring(new ShmRing());
          ring->name_ = name;
          ring->base_ = base;
          ring->size_ = static_cast<size_t>(st.st_size);
          ring->header_ = header;
          return ring;
        }
        munmap(base, static_cast<size_t>(st.st_size));
      } else {
        close(fd);
      }
    }
    // The producer creates the ring when its run starts; until then there is nothing to wait on
    // but the name, so this one wait polls (bounded backoff, never past the deadline).
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat("shm ring ", name, " did not appear within ",
                                                      absl::FormatDuration(deadline)));
    }
    absl::SleepFor(std::min(backoff, until - absl::Now()));
    backoff = std::min(backoff * 2, absl::Milliseconds(20));
  }
}

ShmRing::~ShmRing() {
  if (base_ != nullptr) munmap(base_, size_);
  if (owner_) shm_unlink(("/" + name_).c_str());
}

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
    const timespec ts = absl::ToTimespec(std::min(left, absl::Milliseconds(100)));
    // Sleeps only while the word still holds `cur`; Abort() and the peer wake it.
    Futex(&s->state, FUTEX_WAIT, cur, &ts);
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
  Futex(&s->state, FUTEX_WAKE, INT_MAX, nullptr);
  ++next_;
  return absl::OkStatus();
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
  Futex(&s->state, FUTEX_WAKE, INT_MAX, nullptr);
  holding_ = false;
  ++next_;
  return absl::OkStatus();
}

void ShmRing::Abort() {
  header_->aborted.store(1, std::memory_order_release);
  for (uint32_t i = 0; i < header_->slots; ++i)
    Futex(&slot(i)->state, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace dflash::transport

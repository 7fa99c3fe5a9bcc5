#include "common/transport/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dflash::transport {
namespace {

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 200) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the magic must be a plain word");

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& what,
                                                               const std::string& name,
                                                               size_t size) {
  if (!ValidName(name))
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad name '", name, "'"));
  if (size < sizeof(uint64_t)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", name, ": segment too small"));
  }
  const std::string path = "/" + name;
  const int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const int e = errno;
    return e == EEXIST ? absl::AlreadyExistsError(absl::StrCat(what, " ", name, " exists"))
                       : absl::InternalError(absl::StrCat("shm_open ", name, ": ", strerror(e)));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(path.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " ", name, ": cannot size to ", size, " bytes: ", strerror(e)));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    const int e = errno;
    shm_unlink(path.c_str());
    return absl::InternalError(absl::StrCat("mmap ", what, " ", name, ": ", strerror(e)));
  }
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = name;
  s->owner_ = true;
  s->base_ = base;
  s->size_ = size;
  return s;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& what,
                                                             const std::string& name,
                                                             uint64_t magic,
                                                             absl::Duration deadline) {
  if (!ValidName(name))
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad name '", name, "'"));
  const absl::Time until = absl::Now() + deadline;
  const std::string path = "/" + name;
  absl::Duration backoff = absl::Microseconds(100);
  for (;;) {
    const int fd = shm_open(path.c_str(), O_RDWR, 0);
    if (fd >= 0) {
      struct stat st {};
      if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(uint64_t)) {
        const size_t size = static_cast<size_t>(st.st_size);
        void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (base == MAP_FAILED) {
          return absl::InternalError(absl::StrCat("mmap ", what, " ", name, ": ", strerror(errno)));
        }
        if (static_cast<std::atomic<uint64_t>*>(base)->load(std::memory_order_acquire) == magic) {
          std::unique_ptr<ShmSegment> s(new ShmSegment());
          s->name_ = name;
          s->base_ = base;
          s->size_ = size;
          return s;
        }
        munmap(base, size);
      } else {
        close(fd);
      }
    }
    // The creator makes the segment when its run starts; until then there is nothing to wait on
    // but the name, so this one wait polls (bounded backoff, never past the deadline).
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " ", name, " did not appear within ", absl::FormatDuration(deadline)));
    }
    absl::SleepFor(std::min(backoff, until - absl::Now()));
    backoff = std::min(backoff * 2, absl::Milliseconds(20));
  }
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) munmap(base_, size_);
  if (owner_) shm_unlink(("/" + name_).c_str());
}

bool ShmSegment::Unlink(const std::string& name) {
  return ValidName(name) && shm_unlink(("/" + name).c_str()) == 0;
}

void ShmSegment::Publish(uint64_t magic) {
  std::atomic_thread_fence(std::memory_order_release);
  static_cast<std::atomic<uint64_t>*>(base_)->store(magic, std::memory_order_release);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration max) {
  const timespec ts = absl::ToTimespec(std::max(max, absl::ZeroDuration()));
  // Not FUTEX_PRIVATE: the waker may be another process sharing the mapping.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace dflash::transport

#include "common/transport/host_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dflash::transport {
namespace {

constexpr uint64_t kMagic = 0x314d4d4f43464c44ull;  // "DLFCOMM1"
constexpr size_t kAlign = 64;
constexpr char kWhat[] = "host communicator";

size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// out[i] = slot 0 + slot 1 + ... in rank order: the same terms in the same order on every rank.
template <typename T>
void SumSlots(uint8_t* const* slots, int world, T* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T acc = reinterpret_cast<const T*>(slots[0])[i];
    for (int r = 1; r < world; ++r) acc += reinterpret_cast<const T*>(slots[r])[i];
    out[i] = acc;
  }
}

}  // namespace

struct HostCommunicator::Header {
  uint64_t magic;  // first: ShmSegment publishes it
  uint32_t world;
  uint32_t reserved;
  uint64_t chunk_bytes;
  std::atomic<uint32_t> aborted;
  std::atomic<uint32_t> arrived;     // ranks at the current barrier
  std::atomic<uint32_t> generation;  // barriers completed: the futex word
};

absl::StatusOr<std::unique_ptr<HostCommunicator>> HostCommunicator::Create(const std::string& name,
                                                                           const Options& options) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": rank ", options.rank, " is outside a world of ", options.world));
  }
  if (options.chunk_bytes < 64 || options.chunk_bytes % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": chunk_bytes must be a multiple of 8, at least 64"));
  }
  std::unique_ptr<HostCommunicator> c(new HostCommunicator(options));
  c->name_ = name;
  if (options.world == 1) return c;
  const size_t size =
      RoundUp(sizeof(Header)) + static_cast<size_t>(options.world) * RoundUp(options.chunk_bytes);
  absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
      options.rank == 0 ? ShmSegment::Create(kWhat, name, size)
                        : ShmSegment::Open(kWhat, name, kMagic, options.open_timeout);
  if (!segment.ok()) return segment.status();
  c->segment_ = *std::move(segment);
  c->header_ = static_cast<Header*>(c->segment_->base());
  if (options.rank == 0) {
    c->header_->world = static_cast<uint32_t>(options.world);
    c->header_->chunk_bytes = options.chunk_bytes;
    c->segment_->Publish(kMagic);
  } else if (c->header_->world != static_cast<uint32_t>(options.world) ||
             c->header_->chunk_bytes != options.chunk_bytes || c->segment_->size() < size) {
    return absl::FailedPreconditionError(
        absl::StrCat(kWhat, " ", name, ": rank 0 made it for a world of ", c->header_->world,
                     " with ", c->header_->chunk_bytes, "-byte chunks; this rank expects ",
                     options.world, " and ", options.chunk_bytes));
  }
  return c;
}

HostCommunicator::~HostCommunicator() = default;

uint8_t* HostCommunicator::slot(int rank) const {
  return static_cast<uint8_t*>(segment_->base()) + RoundUp(sizeof(Header)) +
         static_cast<size_t>(rank) * RoundUp(options_.chunk_bytes);
}

absl::Status HostCommunicator::Barrier() {
  Header& h = *header_;
  const uint32_t generation = h.generation.load(std::memory_order_acquire);
  if (h.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == h.world) {
    h.arrived.store(0, std::memory_order_relaxed);  // before the release below: nobody is in yet
    h.generation.store(generation + 1, std::memory_order_release);
    FutexWakeAll(&h.generation);
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (;;) {
    if (h.aborted.load(std::memory_order_acquire) != 0) {
      return absl::AbortedError(absl::StrCat(kWhat, " ", name_, " aborted"));
    }
    if (h.generation.load(std::memory_order_acquire) != generation) return absl::OkStatus();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      Abort();  // the peers must not wait out their own deadlines for a rank that gave up
      return absl::DeadlineExceededError(
          absl::StrCat(kWhat, " ", name_, ": rank ", options_.rank, " waited ",
                       absl::FormatDuration(options_.timeout), " for the other ranks; aborted"));
    }
    FutexWait(&h.generation, generation, std::min(left, absl::Milliseconds(100)));
  }
}

absl::Status HostCommunicator::AllReduceSum(void* data, size_t count, ReduceType type,
                                            bool device_memory) {
  if (device_memory) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": device memory; the host communicator reduces host buffers"));
  }
  if (type != ReduceType::kFloat32 && type != ReduceType::kFloat64) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": sums fp32 and fp64 buffers only (16-bit: the nccl communicator)"));
  }
  if (options_.world == 1) return absl::OkStatus();
  if (header_->aborted.load(std::memory_order_acquire) != 0) {
    return absl::AbortedError(absl::StrCat(kWhat, " ", name_, " aborted"));
  }
  const size_t elem = type == ReduceType::kFloat64 ? 8 : 4;
  const size_t per_round = options_.chunk_bytes / elem;
  std::vector<uint8_t*> slots(static_cast<size_t>(options_.world));
  for (int r = 0; r < options_.world; ++r) slots[static_cast<size_t>(r)] = slot(r);
  auto* bytes = static_cast<uint8_t*>(data);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(per_round, count - done);
    std::memcpy(slot(options_.rank), bytes + done * elem, n * elem);
    if (absl::Status s = Barrier(); !s.ok()) return s;
    if (type == ReduceType::kFloat64) {
      SumSlots(slots.data(), options_.world, reinterpret_cast<double*>(bytes) + done, n);
    } else {
      SumSlots(slots.data(), options_.world, reinterpret_cast<float*>(bytes) + done, n);
    }
    // Nobody refills a slot before every rank has read all of them.
    if (absl::Status s = Barrier(); !s.ok()) return s;
    done += n;
  }
  return absl::OkStatus();
}

void HostCommunicator::Abort() {
  if (header_ == nullptr) return;
  header_->aborted.store(1, std::memory_order_release);
  FutexWakeAll(&header_->generation);
}

}  // namespace dflash::transport

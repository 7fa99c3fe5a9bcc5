// The `host` communicator among data-parallel drafter processes of one machine (communicator.h):
// a POSIX shared-memory segment with one staging slot per rank and a futex barrier. A reduction
// goes chunk by chunk: every rank copies its chunk into its slot, waits at the barrier, sums all
// slots in rank order into its own buffer, and waits again before the slots are reused. Rank 0
// creates the segment; the other ranks open it (waiting up to the open deadline). Every barrier
// wait has a deadline; on expiry, or when any rank aborts, every rank's wait ends (ABORTED).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/communicator.h"
#include "common/transport/shm_segment.h"

namespace dflash::transport {

class HostCommunicator : public Communicator {
 public:
  struct Options {
    int rank = 0, world = 1;
    size_t chunk_bytes = size_t{4} << 20;        // per rank and round
    absl::Duration timeout = absl::Minutes(10);  // every barrier wait
    absl::Duration open_timeout = absl::Minutes(2);
  };
  // `name`: /dev/shm name shared by the ranks (the coordinator derives it from the run). A world of
  // one needs no segment.
  static absl::StatusOr<std::unique_ptr<HostCommunicator>> Create(const std::string& name,
                                                                  const Options& options);
  ~HostCommunicator() override;

  int rank() const override { return options_.rank; }
  int world() const override { return options_.world; }
  absl::Status AllReduceSum(void* data, size_t count, ReduceType type, bool device_memory) override;
  void Abort() override;

 private:
  struct Header;
  explicit HostCommunicator(Options options) : options_(options) {}
  absl::Status Barrier();
  uint8_t* slot(int rank) const;

  Options options_;
  std::string name_;
  std::unique_ptr<ShmSegment> segment_;
  Header* header_ = nullptr;
};

}  // namespace dflash::transport

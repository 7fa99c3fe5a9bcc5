// The `nccl` communicator among data-parallel drafters on GPUs (communicator.h). Bootstrap goes
// through the coordinator: the pair-0 drafter makes the unique id (NewNcclUniqueId, which also
// starts NCCL's bootstrap root in that process), the coordinator hands it to the other drafters
// in PrepareRun, and every rank joins at its first reduction (a collective, so it happens inside
// the step that all drafters run at once). Initialization and every reduction are non-blocking
// NCCL calls polled against the deadline; on expiry, or on Abort() from another thread, the
// communicator is aborted (ncclCommAbort) and every later call fails with ABORTED. Reductions
// are in place on this rank's device; host buffers are staged through a device scratch buffer.
// Built with CUDA and NCCL only; otherwise every call is UNIMPLEMENTED.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/communicator.h"

namespace dflash::transport {

// ncclGetUniqueId as bytes (128), from the process that will hold rank 0.
absl::StatusOr<std::string> NewNcclUniqueId();

class NcclCommunicator : public Communicator {
 public:
  struct Options {
    int rank = 0, world = 1;
    int device = 0;                              // this rank's CUDA device
    absl::Duration timeout = absl::Minutes(10);  // initialization and every reduction
  };
  // Checks the arguments; the communicator is created at the first AllReduceSum.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(const std::string& unique_id,
                                                                  const Options& options);
  ~NcclCommunicator() override;

  int rank() const override { return options_.rank; }
  int world() const override { return options_.world; }
  absl::Status AllReduceSum(void* data, size_t count, ReduceType type, bool device_memory) override;
  absl::Status StartAllReduceSum(void* data, size_t count, ReduceType type,
                                 bool device_memory) override;
  absl::Status WaitStarted() override;
  void Abort() override;

 private:
  struct State;
  NcclCommunicator(std::string unique_id, Options options);
  absl::Status EnsureInitialized();
  // Polls the communicator (and the stream, unless `queued_only`: the call's enqueueing alone) to
  // the deadline.
  absl::Status Wait(const char* what, bool queued_only = false);

  std::string unique_id_;
  Options options_;
  std::unique_ptr<State> state_;
  std::mutex mu_;  // one reduction at a time
  std::atomic<bool> abort_requested_{false};
};

}  // namespace dflash::transport

// Collectives among the data-parallel drafters of a run: the gradient
// all-reduce and the step's loss normalizers. One interface, two implementations chosen with the
// feature transport: `host` (shared memory among the drafter processes of one machine,
// host_communicator.h) and `nccl` (GPUs, nccl_communicator.h). Sums are deterministic: every rank
// receives bit-identical results, and the order of the terms is rank 0, 1, ..., so that two ranks
// with one micro-batch each sum their gradients exactly as one rank accumulating both would.
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace dflash::transport {

// kBFloat16 and kFloat16 (a tensor-parallel target's activations) on the nccl communicator only.
enum class ReduceType { kFloat32, kFloat64, kBFloat16, kFloat16 };

inline size_t ReduceTypeSize(ReduceType type) {
  switch (type) {
    case ReduceType::kFloat64:
      return 8;
    case ReduceType::kFloat32:
      return 4;
    default:
      return 2;
  }
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // In place: data[i] = sum over ranks of their data[i]. `data` is host memory, or device memory
  // of this rank's GPU when device_memory() is true (for the nccl communicator; host memory is
  // staged through the device there). Every wait has the communicator's deadline; on expiry the
  // communicator is aborted (DEADLINE_EXCEEDED), and after an abort every call fails with ABORTED.
  virtual absl::Status AllReduceSum(void* data, size_t count, ReduceType type,
                                    bool device_memory) = 0;
  // The same sum, started now and finished by WaitStarted(), in order with every other reduction
  // of the communicator, so that it can overlap with work this rank still queues (the gradient
  // buckets during the backward). `data` must stay valid and untouched until WaitStarted()
  // returns. Device memory: the reduction waits on the device for the work queued so far on the
  // default stream. This default runs it at once (no overlap); the nccl communicator overlaps.
  virtual absl::Status StartAllReduceSum(void* data, size_t count, ReduceType type,
                                         bool device_memory) {
    return AllReduceSum(data, count, type, device_memory);
  }
  virtual absl::Status WaitStarted() { return absl::OkStatus(); }
  // From any thread: wakes every wait of every rank with ABORTED (the run is being released).
  virtual void Abort() = 0;
};

}  // namespace dflash::transport

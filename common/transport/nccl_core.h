// The part of NCCL that the feature channel (nccl_channel.h) and the gradient communicator
// (nccl_communicator.h) share: a non-blocking communicator joined and waited on by polling, so
// that a missing or dead peer ends at a deadline or on Abort() from another thread instead of
// hanging, and aborted (ncclCommAbort, never a waiting destroy) on any error. Private to
// common/transport: included only by its .cc files built with NCCL (DFLASH_HAVE_NCCL).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dflash::transport {

class NcclCore {
 public:
  // `who` starts every message ("nccl channel", "nccl communicator"); `abort_requested` is the
  // owner's flag that Abort() sets from any thread.
  NcclCore(std::string who, int rank, absl::Duration timeout,
           const std::atomic<bool>* abort_requested);
  ~NcclCore();  // aborts the communicator: a peer that is gone is never waited for
  NcclCore(const NcclCore&) = delete;
  NcclCore& operator=(const NcclCore&) = delete;

  // Starts joining a communicator of `world` ranks (`unique_id`: the bytes of an ncclUniqueId)
  // and waits until every rank has (`what` names them in a timeout's message).
  absl::Status Join(const std::string& unique_id, int world, const std::string& what);
  // Polls the communicator's asynchronous state until its calls are queued and `ready` (when
  // given) says true, until the deadline (DEADLINE_EXCEEDED) or an abort request (ABORTED); any
  // of those, a NCCL error or an error from `ready` aborts the communicator.
  absl::Status Wait(const std::string& what,
                    const std::function<absl::StatusOr<bool>()>& ready = nullptr);
  // OK when NCCL queued the call (ncclSuccess or, non-blocking, ncclInProgress); otherwise the
  // communicator is aborted and the error names `what`.
  absl::Status Queued(ncclResult_t r, const std::string& what);
  // A CUDA call's status, with the context "<who>: <what>" (cuda_status.h).
  absl::Status Cuda(cudaError_t e, const std::string& what) const;
  // Aborts the communicator (if any) and returns `status`; every later use is ABORTED.
  absl::Status Fail(absl::Status status);

  bool joined() const { return comm_ != nullptr; }
  // ABORTED after Fail or an abort request; OK otherwise.
  absl::Status CheckUsable() const;
  ncclComm_t comm() const { return comm_; }

 private:
  std::string who_;
  int rank_;
  absl::Duration timeout_;
  const std::atomic<bool>* abort_requested_;
  ncclComm_t comm_ = nullptr;
  bool failed_ = false;
};

// cudaEventQuery / cudaStreamQuery as a `ready` of NcclCore::Wait: true when the work is done.
absl::StatusOr<bool> CudaDone(cudaError_t query, const NcclCore& core, const std::string& what);

}  // namespace dflash::transport

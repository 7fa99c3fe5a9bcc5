#include "common/transport/nccl_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/cuda_status.h"

namespace dflash::transport {

NcclCore::NcclCore(std::string who, int rank, absl::Duration timeout,
                   const std::atomic<bool>* abort_requested)
    : who_(std::move(who)), rank_(rank), timeout_(timeout), abort_requested_(abort_requested) {}

NcclCore::~NcclCore() {
  if (comm_ != nullptr) ncclCommAbort(comm_);
}

absl::Status NcclCore::Fail(absl::Status status) {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  failed_ = true;
  return status;
}

absl::Status NcclCore::CheckUsable() const {
  if (failed_ || abort_requested_->load())
    return absl::AbortedError(absl::StrCat(who_, " aborted"));
  return absl::OkStatus();
}

absl::Status NcclCore::Cuda(cudaError_t e, const std::string& what) const {
  return CudaStatus(e, cudaGetErrorString(e), absl::StrCat(who_, ": ", what));
}

absl::Status NcclCore::Queued(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return Fail(absl::InternalError(absl::StrCat(who_, ": ", what, ": ", ncclGetErrorString(r))));
}

absl::Status NcclCore::Join(const std::string& unique_id, int world, const std::string& what) {
  if (unique_id.size() != sizeof(ncclUniqueId::internal)) {
    return absl::InvalidArgumentError(absl::StrCat(who_, ": the unique id has ", unique_id.size(),
                                                   " bytes, NCCL's has ",
                                                   sizeof(ncclUniqueId::internal)));
  }
  ncclUniqueId id;
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // polled, so that a missing rank ends at the deadline
  if (absl::Status s = Queued(ncclCommInitRankConfig(&comm_, world, id, rank_, &config),
                              "ncclCommInitRankConfig");
      !s.ok()) {
    return s;
  }
  return Wait(what);
}

absl::Status NcclCore::Wait(const std::string& what,
                            const std::function<absl::StatusOr<bool>()>& ready) {
  if (comm_ == nullptr) return CheckUsable();  // never joined, or failed
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      return Fail(absl::InternalError(
          absl::StrCat(who_, ": ", what, ": ", ncclGetErrorString(r != ncclSuccess ? r : async))));
    }
    bool done = async == ncclSuccess;
    if (done && ready) {
      absl::StatusOr<bool> d = ready();
      if (!d.ok()) return Fail(d.status());
      done = *d;
    }
    if (done) return absl::OkStatus();
    const bool abort = abort_requested_->load();
    if (abort || absl::Now() >= deadline) {
      return Fail(abort ? absl::AbortedError(absl::StrCat(who_, " aborted while ", what))
                        : absl::DeadlineExceededError(absl::StrCat(
                              who_, ": rank ", rank_, " waited ", absl::FormatDuration(timeout_),
                              " for ", what, "; aborted")));
    }
    absl::SleepFor(absl::Microseconds(50));
  }
}

absl::StatusOr<bool> CudaDone(cudaError_t query, const NcclCore& core, const std::string& what) {
  if (query == cudaSuccess) return true;
  if (query == cudaErrorNotReady) return false;
  return core.Cuda(query, what);
}

}  // namespace dflash::transport

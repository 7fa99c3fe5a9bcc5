#include "common/transport/nccl_communicator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

#if DFLASH_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/transport/nccl_core.h"
#endif

namespace dflash::transport {

#if DFLASH_HAVE_NCCL

namespace {

ncclDataType_t NcclType(ReduceType type) {
  switch (type) {
    case ReduceType::kFloat64:
      return ncclFloat64;
    case ReduceType::kBFloat16:
      return ncclBfloat16;
    case ReduceType::kFloat16:
      return ncclFloat16;
    default:
      return ncclFloat32;
  }
}

}  // namespace

struct NcclCommunicator::State {
  std::unique_ptr<NcclCore> core;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // device staging for host buffers
  size_t scratch_bytes = 0;
  cudaEvent_t produced = nullptr;  // StartAllReduceSum: the default stream's work so far
};

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return absl::InternalError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const std::string& unique_id, const Options& options) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(absl::StrCat("nccl communicator: rank ", options.rank,
                                                   " is outside a world of ", options.world));
  }
  if (unique_id.size() != sizeof(ncclUniqueId::internal)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl communicator: the unique id has ",
                                                   unique_id.size(), " bytes, NCCL's has ",
                                                   sizeof(ncclUniqueId::internal)));
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(unique_id, options));
}

NcclCommunicator::NcclCommunicator(std::string unique_id, Options options)
    : unique_id_(std::move(unique_id)), options_(options), state_(std::make_unique<State>()) {
  state_->core = std::make_unique<NcclCore>("nccl communicator", options_.rank, options_.timeout,
                                            &abort_requested_);
}

NcclCommunicator::~NcclCommunicator() {
  State& s = *state_;
  cudaSetDevice(options_.device);
  // A clean destroy would wait for the peers; a communicator being dropped must not hang.
  s.core.reset();
  if (s.scratch != nullptr) cudaFree(s.scratch);
  if (s.produced != nullptr) cudaEventDestroy(s.produced);
  if (s.stream != nullptr) cudaStreamDestroy(s.stream);
}

absl::Status NcclCommunicator::Wait(const char* what, bool queued_only) {
  NcclCore& core = *state_->core;
  if (queued_only || state_->stream == nullptr) return core.Wait(what);
  return core.Wait(what, [&]() { return CudaDone(cudaStreamQuery(state_->stream), core, what); });
}

absl::Status NcclCommunicator::EnsureInitialized() {
  State& s = *state_;
  if (s.core->joined()) return absl::OkStatus();
  if (s.stream == nullptr) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return s.core->Cuda(e, "creating its stream");
    }
  }
  return s.core->Join(unique_id_, options_.world, "the other ranks to join");
}

absl::Status NcclCommunicator::AllReduceSum(void* data, size_t count, ReduceType type,
                                            bool device_memory) {
  std::lock_guard<std::mutex> lock(mu_);
  State& s = *state_;
  if (absl::Status st = s.core->CheckUsable(); !st.ok()) return st;
  if (count == 0) return absl::OkStatus();
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return s.core->Cuda(e, "cudaSetDevice");
  }
  // The buffer was written by work queued on other streams of this device: wait for it.
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return s.core->Cuda(e, "synchronizing the device");
  }
  if (absl::Status st = EnsureInitialized(); !st.ok()) return st;
  const size_t bytes = count * ReduceTypeSize(type);
  void* buffer = data;
  if (!device_memory) {
    if (s.scratch_bytes < bytes) {
      if (s.scratch != nullptr) cudaFree(s.scratch);
      s.scratch = nullptr;
      s.scratch_bytes = 0;
      if (cudaError_t e = cudaMalloc(&s.scratch, bytes); e != cudaSuccess) {
        return s.core->Cuda(e, "allocating the staging buffer");
      }
      s.scratch_bytes = bytes;
    }
    buffer = s.scratch;
    if (cudaError_t e = cudaMemcpy(buffer, data, bytes, cudaMemcpyHostToDevice); e != cudaSuccess) {
      return s.core->Cuda(e, "staging to the device");
    }
  }
  if (absl::Status st = s.core->Queued(
          ncclAllReduce(buffer, buffer, count, NcclType(type), ncclSum, s.core->comm(), s.stream),
          "ncclAllReduce");
      !st.ok()) {
    return st;
  }
  if (absl::Status st = Wait("an all-reduce"); !st.ok()) return st;
  if (!device_memory) {
    if (cudaError_t e = cudaMemcpy(data, buffer, bytes, cudaMemcpyDeviceToHost); e != cudaSuccess) {
      return s.core->Cuda(e, "copying back to the host");
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::StartAllReduceSum(void* data, size_t count, ReduceType type,
                                                 bool device_memory) {
  if (!device_memory) return AllReduceSum(data, count, type, device_memory);
  std::lock_guard<std::mutex> lock(mu_);
  State& s = *state_;
  if (absl::Status st = s.core->CheckUsable(); !st.ok()) return st;
  if (count == 0) return absl::OkStatus();
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return s.core->Cuda(e, "cudaSetDevice");
  }
  if (absl::Status st = EnsureInitialized(); !st.ok()) return st;
  if (s.produced == nullptr) {
    if (cudaError_t e = cudaEventCreateWithFlags(&s.produced, cudaEventDisableTiming);
        e != cudaSuccess) {
      return s.core->Cuda(e, "creating an event");
    }
  }
  // The buffer is written by work queued on the default stream (LibTorch's): the reduction waits
  // for it on the device, not on the host.
  cudaError_t e = cudaEventRecord(s.produced, nullptr);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s.stream, s.produced, 0);
  if (e != cudaSuccess) return s.core->Cuda(e, "ordering the reduction");
  if (absl::Status st = s.core->Queued(
          ncclAllReduce(data, data, count, NcclType(type), ncclSum, s.core->comm(), s.stream),
          "ncclAllReduce");
      !st.ok()) {
    return st;
  }
  return Wait("queueing an all-reduce", /*queued_only=*/true);
}

absl::Status NcclCommunicator::WaitStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  State& s = *state_;
  if (absl::Status st = s.core->CheckUsable(); !st.ok()) return st;
  if (!s.core->joined()) return absl::OkStatus();  // nothing was started
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return s.core->Cuda(e, "cudaSetDevice");
  }
  return Wait("the started all-reduces");
}

void NcclCommunicator::Abort() { abort_requested_.store(true); }

#else  // !DFLASH_HAVE_NCCL

struct NcclCommunicator::State {};

namespace {
absl::Status NoNccl() {
  return absl::UnimplementedError("this build has no NCCL (built without CUDA)");
}
}  // namespace

absl::StatusOr<std::string> NewNcclUniqueId() { return NoNccl(); }
absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(const std::string&,
                                                                           const Options&) {
  return NoNccl();
}
NcclCommunicator::NcclCommunicator(std::string unique_id, Options options)
    : unique_id_(std::move(unique_id)), options_(options) {}
NcclCommunicator::~NcclCommunicator() = default;
absl::Status NcclCommunicator::AllReduceSum(void*, size_t, ReduceType, bool) { return NoNccl(); }
absl::Status NcclCommunicator::StartAllReduceSum(void*, size_t, ReduceType, bool) {
  return NoNccl();
}
absl::Status NcclCommunicator::WaitStarted() { return NoNccl(); }
void NcclCommunicator::Abort() {}

#endif  // DFLASH_HAVE_NCCL

}  // namespace dflash::transport

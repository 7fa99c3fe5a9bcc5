#include "services/target_worker/target_runner.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/batching/packed_batch.h"
#include "common/data/run_data.h"
#include "common/device/device_probe.h"
#include "common/train/run_setup.h"
#include "common/transport/cuda_ipc.h"
#include "common/transport/feature_checksum.h"
#include "common/transport/feature_message.h"
#include "common/transport/group.h"
#include "common/transport/nccl_channel.h"
#include "common/transport/shm_ring.h"
#include "services/target_worker/shared_target.h"
#include "services/worker_common/feature_channel.h"
#include "services/worker_common/test_hooks.h"

namespace dflash::worker {
namespace {

template <typename T>
at::Tensor AsTensor(const std::vector<T>& v, c10::ScalarType type) {
  std::vector<int64_t> w(v.begin(), v.end());
  return at::tensor(at::ArrayRef<int64_t>(w), at::TensorOptions().dtype(at::kLong)).to(type);
}

absl::StatusOr<transport::FeatureDType> FeatureType(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return transport::FeatureDType::kFloat32;
    case c10::ScalarType::BFloat16:
      return transport::FeatureDType::kBFloat16;
    case c10::ScalarType::Half:
      return transport::FeatureDType::kFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("target.dtype: no feature encoding for ", c10::toString(t)));
  }
}

class TargetRunner : public StepRunner {
 public:
  absl::StatusOr<Prepared> Prepare(const RunContext& ctx) override {
    if (absl::Status s = CheckTransport(ctx.transport, ctx.gpu); !s.ok()) return s;
    ctx_ = ctx;
    const c10::Device device = ctx.gpu < 0 ? c10::Device(c10::DeviceType::CPU)
                                           : c10::Device(c10::DeviceType::CUDA, ctx.gpu);
    // With evaluations during training the target is loaded full, so that the evaluator decodes
    // with these weights (shared_target.h); a copy already loaded for decoding (regen, eval) with
    // the run's feature layers is reused instead of loading a second one.
    const bool full = ctx.spec.eval.every_steps > 0;
    Prepared prepared;
    train::TargetShard shard;
    if (ctx.tp_world > 1) {
      absl::StatusOr<std::unique_ptr<transport::Communicator>> comm = JoinTargetGroup(&prepared);
      if (!comm.ok()) return comm.status();
      {
        std::lock_guard<std::mutex> lock(mu_);
        tp_comm_ = *std::move(comm);
      }
      shard.rank = ctx.tp_rank;
      shard.world = ctx.tp_world;
      shard.all_reduce = [comm = tp_comm_.get()](const at::Tensor& t) {
        return comm->AllReduceSum(t.data_ptr(), static_cast<size_t>(t.numel()),
                                  ReduceTypeOf(t.scalar_type()), t.is_cuda());
      };
    }
    const auto load = [&] {
      return train::LoadRunTarget(ctx.spec, device, /*embeddings_only=*/false, full, shard);
    };
    if (ctx.tp_world > 1) {  // a tensor-parallel shard: this run's own
      absl::StatusOr<std::unique_ptr<nn::TargetModel>> target = load();
      if (!target.ok()) return target.status();
      target_ = std::shared_ptr<nn::TargetModel>(*std::move(target));
    } else {  // one copy per checkpoint in this process, shared with the evaluator
      const int64_t loads = TargetCache::Process().loads();
      absl::StatusOr<std::shared_ptr<nn::TargetModel>> target =
          TargetCache::Process().Acquire(ctx.spec, device, {.full = full, .features = true}, load);
      if (!target.ok()) return target.status();
      target_ = *std::move(target);
      LOG_RUN(INFO, ctx.run_id, -1)
          << (TargetCache::Process().loads() > loads ? "loaded the target "
                                                     : "reusing the loaded target ")
          << ctx.spec.target.path << (target_->full() ? " (every layer)" : "");
    }
    // Loading frees each layer's originals once fused, into blocks the forward's tensors rarely
    // fit: given back, so that a drafter on the same GPU can have them (docs/memory.md).
    device::ReleaseCachedMemory();
    // The drafter's config from this target, checked here as the drafter will check it: a run
    // whose drafter cannot be built fails on both sides with the same message.
    absl::StatusOr<drafter::DrafterConfig> dc =
        train::RunDrafterConfig(ctx.spec, target_->config());
    if (!dc.ok()) return dc.status();
    absl::StatusOr<data::RunData> data = data::OpenRunData(ctx.spec, /*verify=*/true);
    if (!data.ok()) return data.status();
    if (absl::Status s = data::CheckDataVocabulary(ctx.spec, *data, target_->config().vocab_size);
        !s.ok()) {
      return s;
    }
    data_ = std::make_unique<data::RunData>(*std::move(data));
    absl::StatusOr<transport::FeatureDType> ftype = FeatureType(target_->dtype());
    if (!ftype.ok()) return ftype.status();
    ftype_ = *ftype;
    if (device_features() && ctx.tp_rank == 0) {
      absl::StatusOr<std::unique_ptr<transport::DeviceChecksummer>> checksummer =
          transport::DeviceChecksummer::Create(ctx.gpu);
      if (!checksummer.ok()) return checksummer.status();
      checksummer_ = *std::move(checksummer);
    }
    // Test hooks (test_hooks.h: only the -testhooks executables inject anything).
    const WorkerTestHooks hooks = ReadWorkerTestHooks();
    if (hooks.corrupt_features_message >= 0) {
      corrupt_message_ = hooks.corrupt_features_message;
      LOG_RUN(WARNING, ctx.run_id, -1) << "test hook: message " << corrupt_message_
                                       << "'s features are corrupted after their checksum";
    }
    if (hooks.oom_above_tokens >= 0) {
      inject_oom_above_ = hooks.oom_above_tokens;
      LOG_RUN(WARNING, ctx.run_id, -1)
          << "test hook: forwards above " << inject_oom_above_ << " tokens fail as out of memory";
    }
    token_budget_ = ctx.spec.batching.token_budget;  // sizes the channel and every batch
    const int64_t budget = token_budget_;
    const size_t feature_bytes =
        static_cast<size_t>(budget * target_->feature_dim()) * transport::FeatureDTypeSize(ftype_);
    if (ctx.tp_rank > 0) {
      // A tensor-parallel rank other than 0: the same forward, no channel (rank 0 sends).
      LOG_RUN(INFO, ctx.run_id, -1)
          << "target ready: tensor-parallel rank " << ctx.tp_rank << " of " << ctx.tp_world << " ("
          << ctx.tp_collective << "), " << target_->config().num_hidden_layers
          << " layers, features " << target_->feature_dim() << " wide";
      prepared.applied = Echo();
      return prepared;
    }
    if (ctx.transport == "nccl") return PrepareNccl(feature_bytes, std::move(prepared));
    transport::ShmRing::Options ro;
    ro.slots = kChannelSlots;
    ro.slot_bytes = transport::MaxFeatureMessageBytes(budget, target_->feature_dim(), ftype_,
                                                      /*inline_features=*/!device_features());
    if (device_features()) {
      // One device buffer per ring slot: the ring's order guarantees that the drafter has handed
      // a slot back before the target writes it again.
      absl::StatusOr<std::unique_ptr<transport::CudaIpcSlots>> slots =
          transport::CudaIpcSlots::Create(ctx.gpu, kChannelSlots, feature_bytes);
      if (!slots.ok()) return slots.status();
      slots_ = *std::move(slots);
    }
    // A channel of this name left behind by a crashed attempt is stale: names are per attempt.
    if (transport::ShmSegment::Unlink(ctx.channel)) {
      LOG_RUN(WARNING, ctx.run_id, -1) << "removed a stale channel " << ctx.channel;
    }
    absl::StatusOr<std::unique_ptr<transport::ShmRing>> ring =
        transport::ShmRing::Create(ctx.channel, ro);
    if (!ring.ok()) return ring.status();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ring_ = *std::move(ring);
    }
    LOG_RUN(INFO, ctx.run_id, -1) << "target ready: " << target_->config().num_hidden_layers
                                  << " layers, features " << target_->feature_dim() << " wide, "
                                  << data_->summary.documents << " documents; channel "
                                  << ctx.channel << " (" << ctx.transport << ", " << ro.slots
                                  << " x " << ro.slot_bytes << " bytes)";
    prepared.applied = Echo();
    return prepared;
  }

  // The settings echo (services/coordinator/settings_echo.h RequiredEcho), read back from what
  // this runner built: the loaded model, the token budget its batches and channel are sized by,
  // the channel it created (none on a tensor-parallel rank other than 0).
  std::map<std::string, std::string> Echo() const {
    std::map<std::string, std::string> e = {
        {"target.path", target_->source()},
        {"target.dtype", train::TargetDtypeName(target_->dtype())},
        {"target.layer_ids", absl::StrJoin(target_->layer_ids(), ",")},
        {"batching.token_budget", std::to_string(token_budget_)}};
    if (nccl_) {
      e["placement.transport"] = "nccl";
    } else if (slots_) {
      e["placement.transport"] = "cuda_ipc";
    } else if (ring_) {
      e["placement.transport"] = "host";
    }
    return e;
  }

  static transport::ReduceType ReduceTypeOf(c10::ScalarType t) {
    switch (t) {
      case c10::ScalarType::BFloat16:
        return transport::ReduceType::kBFloat16;
      case c10::ScalarType::Half:
        return transport::ReduceType::kFloat16;
      case c10::ScalarType::Double:
        return transport::ReduceType::kFloat64;
      default:
        return transport::ReduceType::kFloat32;
    }
  }

  // The pair's tensor-parallel group (placement.target_parallel > 1): rank 0 is prepared first and
  // creates the host group or makes the NCCL unique id that the coordinator hands to the others
  // (who join at the first all-reduce).
  absl::StatusOr<std::unique_ptr<transport::Communicator>> JoinTargetGroup(Prepared* prepared) {
    transport::GroupOptions o;
    o.rank = static_cast<int>(ctx_.tp_rank);
    o.world = static_cast<int>(ctx_.tp_world);
    o.collective = ctx_.tp_collective;
    o.name = ctx_.tp_group;
    o.nccl_unique_id = ctx_.tp_nccl_unique_id;
    o.gpu = ctx_.gpu;
    o.timeout = kChannelTimeout;
    o.collective_field = "tp_collective";
    o.name_field = "tp_group";
    return transport::JoinGroup(o, &prepared->tp_nccl_unique_id);
  }

  absl::StatusOr<Prepared> PrepareNccl(size_t feature_bytes, Prepared prepared) {
    const size_t message_bytes = transport::MaxFeatureMessageBytes(
        token_budget_, target_->feature_dim(), ftype_, /*inline_features=*/false);
    absl::StatusOr<std::string> descriptor =
        transport::NcclChannel::NewDescriptor(message_bytes, feature_bytes);
    if (!descriptor.ok()) return descriptor.status();
    transport::NcclChannel::Options o;
    o.rank = 0;
    o.device = ctx_.gpu;
    o.slots = kChannelSlots;
    o.timeout = kChannelTimeout;
    absl::StatusOr<std::unique_ptr<transport::NcclChannel>> channel =
        transport::NcclChannel::Create(*descriptor, o);
    if (!channel.ok()) return channel.status();
    {
      std::lock_guard<std::mutex> lock(mu_);
      nccl_ = *std::move(channel);
    }
    LOG_RUN(INFO, ctx_.run_id, -1)
        << "target ready: " << target_->config().num_hidden_layers << " layers, features "
        << target_->feature_dim() << " wide, " << data_->summary.documents
        << " documents; channel nccl (" << o.slots << " x " << feature_bytes << " bytes)";
    prepared.applied = Echo();
    prepared.channel_descriptor = *std::move(descriptor);
    return prepared;
  }

  absl::StatusOr<StepReport> RunStep(const StepWork& work) override {
    StepReport report;
    report.step = work.step;
    step_splits_ = 0;
    uint32_t chain = 0;
    for (const StepMicroBatch& mb : work.micro_batches) {
      absl::Status s =
          batching::MaterializeBatch(data_->source(), mb.pieces, token_budget_, &scratch_);
      if (!s.ok()) return s;
      if (ctx_.tp_rank > 0) {
        // The same forward as rank 0 (its all-reduces need this rank), nothing to send. On host
        // transport the checksum is over the same message bytes as rank 0's, which the coordinator
        // compares.
        absl::StatusOr<uint32_t> crc = ctx_.transport == "host" ? ForwardToHost() : ForwardOnly();
        if (!crc.ok()) return Annotate(crc.status(), "batch ", mb.batch_id);
        chain = ChainChecksum(chain, *crc);
        report.tokens += static_cast<int64_t>(scratch_.input_ids.size());
        ++report.micro_batches;
        continue;
      }
      // The device buffer to write the features into (cuda_ipc, nccl), once the batch that last
      // used it has been read by the drafter (cuda_ipc: the ring hands its slot back) or sent
      // (nccl).
      void* buffer = nullptr;
      const auto wait_start = std::chrono::steady_clock::now();
      if (ctx_.transport == "nccl") {
        absl::StatusOr<void*> b = nccl_->NextFeatureBuffer();
        if (!b.ok()) return Annotate(b.status(), "batch ", mb.batch_id);
        buffer = *b;
      } else if (device_features()) {
        if (absl::Status free = ring_->WaitFree(kChannelTimeout); !free.ok()) {
          if (free.code() == absl::StatusCode::kDeadlineExceeded) ring_->Abort();
          return Annotate(free, "batch ", mb.batch_id);
        }
        buffer = slots_->slot(static_cast<uint32_t>(sent_ % slots_->size()));
      }
      report.transport_wait_seconds += SecondsSince(wait_start);
      absl::StatusOr<uint32_t> crc = buffer != nullptr ? ForwardInto(buffer) : ForwardToHost();
      if (!crc.ok()) return crc.status();
      const auto send_start = std::chrono::steady_clock::now();
      const int64_t feature_bytes = static_cast<int64_t>(scratch_.input_ids.size()) *
                                    target_->feature_dim() *
                                    static_cast<int64_t>(transport::FeatureDTypeSize(ftype_));
      absl::Status sent =
          ctx_.transport == "nccl"
              ? nccl_->Send(mb.batch_id, message_, static_cast<size_t>(feature_bytes))
              : ring_->Send(mb.batch_id, message_, kChannelTimeout);
      report.transport_wait_seconds += SecondsSince(send_start);
      report.transport_bytes += static_cast<int64_t>(message_.size());
      if (buffer != nullptr) report.transport_bytes += feature_bytes;
      if (!sent.ok()) {
        if (sent.code() == absl::StatusCode::kDeadlineExceeded && ring_) ring_->Abort();
        return Annotate(sent, "sending batch ", mb.batch_id);
      }
      ++sent_;
      if (ring_) {
        report.max_queue_depth =
            std::max<int64_t>(report.max_queue_depth, static_cast<int64_t>(ring_->Depth()));
      }
      chain = ChainChecksum(chain, *crc);
      report.tokens += static_cast<int64_t>(scratch_.input_ids.size());
      ++report.micro_batches;
    }
    report.checksum = chain;
    report.oom_splits = step_splits_;
    if (step_splits_ > 0) {
      LOG_RUN(WARNING, ctx_.run_id, work.step)
          << "out of memory: " << step_splits_
          << " split(s) of a micro-batch's documents into halves; the features are the same";
    }
    return report;
  }

  bool device_features() const { return ctx_.transport != "host"; }

  static double SecondsSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  template <typename... Parts>
  static absl::Status Annotate(const absl::Status& s, const Parts&... parts) {
    return absl::Status(s.code(), absl::StrCat(parts..., ": ", s.message()));
  }

  // Runs the target on documents [d0, d1) of the packed batch into `out` (their rows). Out of
  // device memory: the documents in two halves, recursively; a document's rows depend on that
  // document only, so the features are the same.
  absl::Status ForwardDocs(const at::Tensor& ids, const at::Tensor& positions, size_t d0, size_t d1,
                           const at::Tensor& out, int64_t* splits) {
    const std::vector<int32_t>& cu = scratch_.cu_seqlens;
    const int64_t r0 = cu[d0], r1 = cu[d1];
    absl::Status s;
    if (inject_oom_above_ > 0 && r1 - r0 > inject_oom_above_) {
      s = absl::ResourceExhaustedError(absl::StrCat("injected out of memory (test hook): ", r1 - r0,
                                                    " tokens above ", inject_oom_above_));
    } else {
      std::vector<int32_t> sub(cu.begin() + static_cast<int64_t>(d0),
                               cu.begin() + static_cast<int64_t>(d1) + 1);
      for (int32_t& c : sub) c -= static_cast<int32_t>(r0);
      const at::NoGradGuard no_grad;
      s = target_->Forward(ids.narrow(0, r0, r1 - r0), positions.narrow(0, r0, r1 - r0),
                           AsTensor(sub, at::kInt), out);
    }
    if (s.code() != absl::StatusCode::kResourceExhausted) return s;
    if (d1 - d0 < 2) {
      return absl::ResourceExhaustedError(
          absl::StrCat(s.message(), "; not recoverable: one document of ", r1 - r0,
                       " tokens (lower data.max_length or batching.token_budget)"));
    }
    const size_t mid = d0 + (d1 - d0 + 1) / 2;
    ++*splits;
    LOG(WARNING) << "out of memory in the target's forward on " << r1 - r0 << " tokens (" << d1 - d0
                 << " documents): " << s.message() << "; running its halves";
    const int64_t rm = cu[mid];
    if (absl::Status a = ForwardDocs(ids, positions, d0, mid, out.narrow(0, 0, rm - r0), splits);
        !a.ok()) {
      return a;
    }
    return ForwardDocs(ids, positions, mid, d1, out.narrow(0, rm - r0, r1 - rm), splits);
  }

  absl::Status ForwardBatch(const at::Tensor& out) {
    const int64_t splits_before = step_splits_;
    absl::Status s = ForwardDocs(AsTensor(scratch_.input_ids, at::kLong),
                                 AsTensor(scratch_.positions, at::kLong), 0,
                                 scratch_.cu_seqlens.size() - 1, out, &step_splits_);
    // After an out-of-memory, the failed attempt's blocks stay in this process's cache unless
    // given back: a drafter on the same GPU would run out of memory on them next.
    if (step_splits_ > splits_before) device::ReleaseCachedMemory();
    return s;
  }

  // host: runs the target, copies the features into the message.
  absl::StatusOr<uint32_t> ForwardToHost() {
    const int64_t t = static_cast<int64_t>(scratch_.input_ids.size());
    at::Tensor out;
    try {
      out = at::empty({t, target_->feature_dim()},
                      at::TensorOptions().dtype(target_->dtype()).device(target_->device()));
    } catch (const c10::Error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating target features: ", e.what_without_backtrace()));
    }
    if (absl::Status s = ForwardBatch(out); !s.ok()) return s;
    const at::Tensor features = out.to(c10::Device(c10::DeviceType::CPU)).contiguous();
    return transport::EncodeFeatureMessage(scratch_, features.data_ptr(), target_->feature_dim(),
                                           ftype_, &message_);
  }

  // A tensor-parallel rank other than 0 on a GPU transport: the forward into a scratch buffer.
  absl::StatusOr<uint32_t> ForwardOnly() {
    const int64_t t = static_cast<int64_t>(scratch_.input_ids.size());
    try {
      at::Tensor out =
          at::empty({t, target_->feature_dim()},
                    at::TensorOptions().dtype(target_->dtype()).device(target_->device()));
      if (absl::Status s = ForwardBatch(out); !s.ok()) return s;
    } catch (const c10::Error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating target features: ", e.what_without_backtrace()));
    }
    return 0u;
  }

  // cuda_ipc, nccl: runs the target straight into the device buffer the next message names
  // (cuda_ipc: the ring slot's; nccl: the channel's, sent device to device after the forward).
  absl::StatusOr<uint32_t> ForwardInto(void* buffer) {
    const int64_t t = static_cast<int64_t>(scratch_.input_ids.size());
    const at::Tensor features =
        at::from_blob(buffer, {t, target_->feature_dim()},
                      at::TensorOptions().dtype(target_->dtype()).device(target_->device()));
    if (absl::Status s = ForwardBatch(features); !s.ok()) return s;
    transport::DeviceFeatureRef ref;  // nccl: no handle, the features follow the message
    // Waits for the forward (the value travels in the message).
    absl::StatusOr<transport::FeatureChecksum> sum =
        checksummer_->Compute(features.data_ptr(), features.nbytes());
    if (!sum.ok()) return sum.status();
    ref.checksum_sum = sum->sum;
    ref.checksum_weighted = sum->weighted;
    if (static_cast<int64_t>(sent_) == corrupt_message_) {
      const at::Tensor bytes = features.view(at::kByte).view({-1});
      bytes.narrow(0, bytes.numel() / 2, 1).bitwise_xor_(1);
    }
    if (ctx_.transport == "cuda_ipc") {
      // Published only once written: the drafter reads the slot as soon as the message arrives.
      // (nccl's transfer waits for the forward on the device.)
      if (absl::Status s = transport::SynchronizeDevice(ctx_.gpu); !s.ok()) return s;
      ref.ipc_handle = slots_->handle(static_cast<uint32_t>(sent_ % slots_->size()));
    }
    return transport::EncodeFeatureMessageRef(scratch_, target_->feature_dim(), ftype_, ref,
                                              &message_);
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ring_) ring_->Abort();
    if (nccl_) nccl_->Abort();
    if (tp_comm_) tp_comm_->Abort();
  }

 private:
  RunContext ctx_;
  std::shared_ptr<nn::TargetModel> target_;  // shared with the evaluator when loaded full
  std::unique_ptr<data::RunData> data_;
  transport::FeatureDType ftype_ = transport::FeatureDType::kFloat32;
  std::mutex mu_;
  std::unique_ptr<transport::ShmRing> ring_;
  std::unique_ptr<transport::CudaIpcSlots> slots_;    // cuda_ipc only
  std::unique_ptr<transport::NcclChannel> nccl_;      // nccl only
  std::unique_ptr<transport::Communicator> tp_comm_;  // the tensor-parallel group (tp_world > 1)
  int64_t step_splits_ = 0;                           // this step's out-of-memory splits
  int64_t token_budget_ = 0;                          // batching.token_budget (echoed)
  int64_t inject_oom_above_ = 0;                      // test hook (test_hooks.h)
  int64_t corrupt_message_ = -1;                      // test hook (test_hooks.h)
  std::unique_ptr<transport::DeviceChecksummer> checksummer_;  // cuda_ipc, nccl (rank 0)
  uint64_t sent_ = 0;  // messages sent (= ring slot counter)
  batching::PackedBatch scratch_;
  std::vector<uint8_t> message_;
};

}  // namespace

std::unique_ptr<StepRunner> NewTargetRunner() { return std::make_unique<TargetRunner>(); }

}  // namespace dflash::worker

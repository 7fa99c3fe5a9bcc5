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
#include "common/transport/feature_channel.h"
#include "common/transport/feature_message.h"
#include "common/transport/group.h"
#include "services/target_worker/shared_target.h"
#include "services/worker_common/channel_limits.h"
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
    absl::StatusOr<transport::Transport> t = transport::ParseTransport(ctx.transport);
    if (!t.ok()) return t.status();
    if (absl::Status s = transport::CheckTransportDevice(*t, ctx.gpu); !s.ok()) return s;
    transport_ = *t;
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
      shard.all_reduce = NoGroupYet();  // each user binds its own group (shared_target.h)
    }
    const auto load = [&] {
      return train::LoadRunTarget(ctx.spec, device, /*embeddings_only=*/false, full, shard);
    };
    // One copy per checkpoint (and shard) in this process, shared with the evaluator.
    const int64_t loads = TargetCache::Process().loads();
    absl::StatusOr<std::shared_ptr<nn::TargetModel>> target = TargetCache::Process().Acquire(
        ctx.spec, device,
        {.full = full, .features = true, .tp_rank = ctx.tp_rank, .tp_world = ctx.tp_world}, load);
    if (!target.ok()) return target.status();
    target_ = *std::move(target);
    if (ctx.tp_world > 1) {
      // The steps sum over the run's group; the cached shard (kept alive in cached_) sums over
      // none, so that an evaluation can decode with it over a group of its own at the same time.
      cached_ = target_;
      target_ = std::shared_ptr<nn::TargetModel>(cached_->WithAllReduce(SumOver(tp_comm_.get())));
    }
    LOG_RUN(INFO, ctx.run_id, -1) << (TargetCache::Process().loads() > loads
                                          ? "loaded the target "
                                          : "reusing the loaded target ")
                                  << ctx.spec.target.path
                                  << (target_->full() ? " (every layer)" : "")
                                  << (ctx.tp_world > 1 ? absl::StrCat(", shard ", ctx.tp_rank,
                                                                      " of ", ctx.tp_world)
                                                       : std::string());
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
    // Test hooks (test_hooks.h: only the -testhooks executables inject anything).
    const WorkerTestHooks hooks = ReadWorkerTestHooks();
    if (hooks.corrupt_features_message >= 0) {
      LOG_RUN(WARNING, ctx.run_id, -1) << "test hook: message " << hooks.corrupt_features_message
                                       << "'s features are corrupted after their checksum";
    }
    if (hooks.oom_above_tokens >= 0) {
      inject_oom_above_ = hooks.oom_above_tokens;
      LOG_RUN(WARNING, ctx.run_id, -1)
          << "test hook: forwards above " << inject_oom_above_ << " tokens fail as out of memory";
    }
    token_budget_ = ctx.spec.batching.token_budget;  // sizes the channel and every batch
    if (ctx.tp_rank > 0) {
      // A tensor-parallel rank other than 0: the same forward, no channel (rank 0 sends).
      LOG_RUN(INFO, ctx.run_id, -1)
          << "target ready: tensor-parallel rank " << ctx.tp_rank << " of " << ctx.tp_world << " ("
          << ctx.tp_collective << "), " << target_->config().num_hidden_layers
          << " layers, features " << target_->feature_dim() << " wide";
      prepared.applied = Echo();
      prepared.kernels = target_->Kernels();
      return prepared;
    }
    transport::FeatureChannelOptions o;
    o.transport = transport_;
    o.name = ctx.channel;
    o.gpu = ctx.gpu;
    o.slots = kChannelSlots;
    o.timeout = kChannelTimeout;
    o.max_tokens = token_budget_;
    o.feature_dim = target_->feature_dim();
    o.dtype = ftype_;
    if (hooks.corrupt_features_message >= 0 && device_features()) {
      o.after_checksum = [index = static_cast<uint64_t>(hooks.corrupt_features_message),
                          device = target_->device()](void* features, size_t bytes,
                                                      uint64_t message) {
        if (message != index) return;
        const at::Tensor b = at::from_blob(features, {static_cast<int64_t>(bytes)},
                                           at::TensorOptions().dtype(at::kByte).device(device));
        b.narrow(0, b.numel() / 2, 1).bitwise_xor_(1);
      };
    }
    absl::StatusOr<std::unique_ptr<transport::FeatureSender>> sender =
        transport::FeatureSender::Create(o);
    if (!sender.ok()) return sender.status();
    {
      std::lock_guard<std::mutex> lock(mu_);
      sender_ = *std::move(sender);
    }
    LOG_RUN(INFO, ctx.run_id, -1) << "target ready: " << target_->config().num_hidden_layers
                                  << " layers, features " << target_->feature_dim() << " wide, "
                                  << data_->summary.documents << " documents; channel "
                                  << sender_->Describe();
    prepared.applied = Echo();
    prepared.kernels = target_->Kernels();
    // nccl: the channel's descriptor, which the coordinator hands to the drafter (the rings are
    // named by the coordinator).
    if (transport_ == transport::Transport::kNccl) prepared.channel_descriptor = sender_->handoff();
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
    if (sender_) e["placement.transport"] = transport::TransportName(sender_->transport());
    return e;
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
        absl::StatusOr<uint32_t> crc = device_features() ? ForwardOnly() : HostMessageCrc();
        if (!crc.ok()) return Annotate(crc.status(), "batch ", mb.batch_id);
        chain = ChainChecksum(chain, *crc);
        report.tokens += static_cast<int64_t>(scratch_.input_ids.size());
        ++report.micro_batches;
        continue;
      }
      // The device buffer to write the features into (cuda_ipc, nccl), once the batch that last
      // used it is done with it.
      void* buffer = nullptr;
      const auto wait_start = std::chrono::steady_clock::now();
      if (device_features()) {
        absl::StatusOr<void*> b = sender_->NextBuffer();
        if (!b.ok()) return Annotate(b.status(), "batch ", mb.batch_id);
        buffer = *b;
      }
      report.transport_wait_seconds += SecondsSince(wait_start);
      at::Tensor host;
      if (absl::Status s = buffer != nullptr ? ForwardInto(buffer) : ForwardToHost(&host);
          !s.ok()) {
        return s;
      }
      const auto send_start = std::chrono::steady_clock::now();
      int64_t bytes = 0;
      absl::StatusOr<uint32_t> crc = sender_->Send(
          mb.batch_id, scratch_, buffer != nullptr ? buffer : host.data_ptr(), &bytes);
      report.transport_wait_seconds += SecondsSince(send_start);
      if (!crc.ok()) return Annotate(crc.status(), "sending batch ", mb.batch_id);
      report.transport_bytes += bytes;
      report.max_queue_depth = std::max(report.max_queue_depth, sender_->Depth());
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

  bool device_features() const { return transport::DeviceFeatures(transport_); }

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

  // host: runs the target into `features` on the host.
  absl::Status ForwardToHost(at::Tensor* features) {
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
    *features = out.to(c10::Device(c10::DeviceType::CPU)).contiguous();
    return absl::OkStatus();
  }

  // host, a tensor-parallel rank other than 0: the CRC-32 of the message rank 0 sends (which
  // the coordinator compares), from the same forward.
  absl::StatusOr<uint32_t> HostMessageCrc() {
    at::Tensor features;
    if (absl::Status s = ForwardToHost(&features); !s.ok()) return s;
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
  // (the channel checksums and publishes it in Send).
  absl::Status ForwardInto(void* buffer) {
    const int64_t t = static_cast<int64_t>(scratch_.input_ids.size());
    const at::Tensor features =
        at::from_blob(buffer, {t, target_->feature_dim()},
                      at::TensorOptions().dtype(target_->dtype()).device(target_->device()));
    return ForwardBatch(features);
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (sender_) sender_->Abort();
    if (tp_comm_) tp_comm_->Abort();
  }

 private:
  RunContext ctx_;
  std::shared_ptr<nn::TargetModel> target_;  // shared with the evaluator when loaded full
  std::unique_ptr<data::RunData> data_;
  transport::FeatureDType ftype_ = transport::FeatureDType::kFloat32;
  std::mutex mu_;
  transport::Transport transport_ = transport::Transport::kHost;
  std::unique_ptr<transport::FeatureSender> sender_;  // tensor-parallel rank 0 only
  std::unique_ptr<transport::Communicator> tp_comm_;  // the tensor-parallel group (tp_world > 1)
  std::shared_ptr<nn::TargetModel> cached_;  // tp_world > 1: the cache's shard, bound in target_
  int64_t step_splits_ = 0;                  // this step's out-of-memory splits
  int64_t token_budget_ = 0;                 // batching.token_budget (echoed)
  int64_t inject_oom_above_ = 0;             // test hook (test_hooks.h)
  batching::PackedBatch scratch_;
  std::vector<uint8_t> message_;
};

}  // namespace

std::unique_ptr<StepRunner> NewTargetRunner() { return std::make_unique<TargetRunner>(); }

}  // namespace dflash::worker

#include "services/drafter_worker/drafter_runner.h"

#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/device/device_probe.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/train/local_run.h"
#include "common/train/run_options.h"
#include "common/train/run_setup.h"
#include "common/train/trainer.h"
#include "common/transport/feature_channel.h"
#include "common/transport/feature_message.h"
#include "common/transport/group.h"
#include "services/worker_common/channel_limits.h"
#include "services/worker_common/test_hooks.h"

namespace dflash::worker {
namespace {

c10::ScalarType ScalarOf(transport::FeatureDType t) {
  switch (t) {
    case transport::FeatureDType::kBFloat16:
      return c10::ScalarType::BFloat16;
    case transport::FeatureDType::kFloat16:
      return c10::ScalarType::Half;
    case transport::FeatureDType::kFloat32:
      break;
  }
  return c10::ScalarType::Float;
}

// How long the drafter waits for its target to create the channel.
constexpr absl::Duration kOpenTimeout = absl::Minutes(2);

class DrafterRunner : public StepRunner {
 public:
  absl::StatusOr<Prepared> Prepare(const RunContext& ctx) override {
    absl::StatusOr<transport::Transport> t = transport::ParseTransport(ctx.transport);
    if (!t.ok()) return t.status();
    if (absl::Status s = transport::CheckTransportDevice(*t, ctx.gpu); !s.ok()) return s;
    ctx_ = ctx;
    Prepared prepared;
    if (absl::Status s = JoinDrafterGroup(&prepared); !s.ok()) return s;
    if (absl::Status s = OpenChannel(*t); !s.ok()) return s;
    const c10::Device device = ctx.gpu < 0 ? c10::Device(c10::DeviceType::CPU)
                                           : c10::Device(c10::DeviceType::CUDA, ctx.gpu);
    absl::StatusOr<train::LocalRunOptions> options =
        train::LocalRunOptionsFor(ctx.spec, ctx.total_steps, ctx.num_pairs);
    if (!options.ok()) return options.status();
    options_ = *options;
    // Only embed_tokens and lm_head are borrowed from the target. The drafter keeps its own
    // handles to them; the rest of the embeddings-only target (its layer 0 and final norm: 0.36
    // GiB at Qwen3-8B shape) is freed at the end of this scope.
    absl::StatusOr<std::unique_ptr<nn::TargetModel>> target =
        train::LoadRunTarget(ctx.spec, device, /*embeddings_only=*/true);
    if (!target.ok()) return target.status();
    target_source_ = (*target)->source();
    max_anchors_ = options_.max_anchors;
    absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> model =
        train::CreateRunDrafter(ctx.spec, **target, device);
    if (!model.ok()) return model.status();
    drafter_ = *std::move(model);
    if (!options_.init_from.empty() && ctx.resume_checkpoint.empty()) {
      if (absl::Status s = drafter::ImportDrafter(options_.init_from, drafter_.get()); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("drafter.init_from: ", s.message()));
      }
    }
    absl::StatusOr<std::unique_ptr<train::DrafterTrainer>> trainer =
        train::DrafterTrainer::Create(drafter_.get(), options_.optim, options_.loss, comm_.get());
    if (!trainer.ok()) return trainer.status();
    trainer_ = *std::move(trainer);
    // Test hook (test_hooks.h: only the -testhooks executables inject anything).
    if (const int64_t oom = ReadWorkerTestHooks().oom_above_tokens; oom >= 0) {
      trainer_->InjectOutOfMemoryAbove(oom);
      LOG_RUN(WARNING, ctx.run_id, -1)
          << "test hook: micro-batches above " << oom << " tokens fail as out of memory";
    }
    if (!ctx.resume_checkpoint.empty()) {
      absl::StatusOr<std::map<std::string, std::string>> meta =
          trainer_->LoadState(ctx.resume_checkpoint);
      if (!meta.ok()) return meta.status();
    }
    // What building the drafter and reading a checkpoint left cached goes back to the driver, for
    // a target on the same GPU (docs/memory.md).
    device::ReleaseCachedMemory();
    LOG_RUN(INFO, ctx.run_id, trainer_->step())
        << "drafter ready: " << drafter_->config().num_layers << " layers, block "
        << drafter_->config().block_size << ", recompute "
        << drafter::RecomputeName(drafter_->options().recompute) << ", " << drafter_->Kernels()
        << (ctx.resume_checkpoint.empty() ? std::string(", fresh")
                                          : absl::StrCat(", resumed from ", ctx.resume_checkpoint));
    prepared.applied = Echo();
    prepared.kernels = drafter_->Kernels();
    return prepared;
  }

  // The settings echo (services/coordinator/settings_echo.h RequiredEcho), read back from what
  // this runner built: the model, the trainer, the communicator, the anchor limit RunStep
  // enforces, and the channel (created here; host and cuda_ipc: its ring opened at the first
  // step).
  std::map<std::string, std::string> Echo() const {
    const drafter::DrafterConfig& c = drafter_->config();
    std::map<std::string, std::string> e = {
        {"target.path", target_source_},
        {"target.layer_ids", absl::StrJoin(c.target_layer_ids, ",")},
        {"drafter.layers", std::to_string(c.num_layers)},
        {"drafter.block_size", std::to_string(c.block_size)},
        {"drafter.mask_token_id", std::to_string(c.mask_token_id)},
        {"drafter.recompute", drafter::RecomputeName(drafter_->options().recompute)},
        {"drafter.sliding_layers", absl::StrJoin(drafter::SlidingLayerIds(c), ",")},
        {"drafter.sliding_window", std::to_string(c.sliding_window)},
        {"drafter.kind", c.dflash2() ? "dflash2" : "dflash"},
        {"drafter.conv_kernel_size", std::to_string(c.conv_kernel_size)},
        {"drafter.conv_group_size", std::to_string(c.conv_group_size)},
        {"drafter.selector_rank", std::to_string(c.selector_rank)},
        {"drafter.selector_top_k", std::to_string(c.selector_top_k)},
        {"loss.selector_alpha", absl::StrCat(trainer_->loss().selector_loss_alpha)},
        {"drafter.precision", drafter_->options().fp8 ? "fp8" : "auto"},
        {"loss.selector_warmup_steps", std::to_string(trainer_->loss().selector_warmup_steps)},
        {"loss.selector_ramp_steps", std::to_string(trainer_->loss().selector_ramp_steps)},
        {"batching.max_anchors", std::to_string(max_anchors_)},
        {"loss.gamma", absl::StrCat(trainer_->loss().gamma)},
        {"loss.weighting",
         trainer_->loss().weighting == drafter::LossWeighting::kDpace ? "dpace" : "decay"},
        {"loss.dpace_alpha", absl::StrCat(trainer_->loss().dpace_alpha)},
        {"optim.lr", absl::StrCat(trainer_->config().lr)},
        {"optim.total_steps", std::to_string(trainer_->config().total_steps)},
        {"resume.step", std::to_string(trainer_->step())},
        {"placement.pairs", std::to_string(comm_ ? comm_->world() : 1)},
        {"placement.transport", transport::TransportName(channel_->transport())}};
    return e;
  }

  absl::StatusOr<StepReport> RunStep(const StepWork& work) override {
    if (work.step != trainer_->step()) {
      return absl::FailedPreconditionError(absl::StrCat("the drafter has trained ",
                                                        trainer_->step(), " steps; step ",
                                                        work.step, " is not the next one"));
    }
    StepReport report;
    report.step = work.step;
    uint32_t chain = 0;
    for (const StepMicroBatch& mb : work.micro_batches) {
      const bool last = &mb == &work.micro_batches.back();
      absl::StatusOr<transport::ReceivedFeatures> received = channel_->Receive(mb.batch_id);
      if (!received.ok()) {
        // The pair is out of step (or the run was released): nothing after this can be trusted.
        channel_->Abort();
        return received.status();
      }
      report.transport_wait_seconds += received->wait_seconds;
      report.transport_bytes += received->bytes;
      report.max_queue_depth = std::max(report.max_queue_depth, channel_->Depth());
      absl::Status s = TrainOn(mb, *received, last);
      absl::Status released = channel_->Release();
      if (!s.ok()) {
        // The pair is out of step: nothing after this batch can be trusted.
        channel_->Abort();
        return s;
      }
      if (!released.ok()) return released;
      chain = ChainChecksum(chain, received->decoded.crc32);
      report.tokens += static_cast<int64_t>(received->decoded.batch.input_ids.size());
      ++report.micro_batches;
    }
    absl::StatusOr<train::StepStats> stats = trainer_->Step();
    if (!stats.ok()) return stats.status();
    report.checksum = chain;
    report.loss = stats->loss;
    report.weight_sum = stats->weight_sum;
    report.grad_norm = stats->grad_norm;
    report.lr = stats->lr;
    report.skipped = stats->skipped;
    report.skipped_steps = trainer_->skipped_steps();
    report.oom_splits = stats->oom_splits;
    if (stats->oom_splits > 0) {
      // The failed attempt's blocks would stay in this process's cache, out of reach of a target
      // on the same GPU whose next micro-batch needs more than it holds.
      device::ReleaseCachedMemory();
      LOG_RUN(WARNING, ctx_.run_id, work.step)
          << "out of memory: " << stats->oom_splits
          << " micro-batch split(s) into halves by document; the step trained every token once";
    }
    report.acceptance_length = stats->acceptance_length;
    for (size_t k = 0; k < stats->slot_total.size(); ++k) {
      report.slot_accuracy.push_back(stats->slot_total[k] > 0
                                         ? static_cast<double>(stats->slot_correct[k]) /
                                               stats->slot_total[k]
                                         : 0.0);
    }
    if (!work.checkpoint_path.empty()) {
      if (absl::Status s = trainer_->SaveState(work.checkpoint_path, work.checkpoint_metadata);
          !s.ok()) {
        return s;
      }
    }
    if (!work.export_dir.empty()) {
      drafter::ExportOptions eo;
      eo.overwrite = true;
      if (absl::Status s = drafter::ExportDrafter(*drafter_, work.export_dir, eo); !s.ok()) {
        return s;
      }
    }
    return report;
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    if (channel_) channel_->Abort();
    if (comm_) comm_->Abort();
  }

 private:
  // Data-parallel drafters (num_pairs > 1) sum their gradients through a communicator: rank =
  // pair. The pair-0 drafter is prepared first: it creates the host group, or makes the NCCL
  // unique id that the coordinator hands to the others (who join at the first step).
  absl::Status JoinDrafterGroup(Prepared* prepared) {
    if (ctx_.num_pairs <= 1) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<transport::Communicator>> comm = NewCommunicator(prepared);
    if (!comm.ok()) return comm.status();
    std::lock_guard<std::mutex> lock(mu_);
    comm_ = *std::move(comm);
    if (aborted_) comm_->Abort();
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<transport::Communicator>> NewCommunicator(Prepared* prepared) {
    transport::GroupOptions o;
    o.rank = static_cast<int>(ctx_.pair);
    o.world = static_cast<int>(ctx_.num_pairs);
    o.collective = ctx_.collective;
    o.name = ctx_.drafter_group;
    o.nccl_unique_id = ctx_.nccl_unique_id;
    o.gpu = ctx_.gpu;
    o.timeout = kChannelTimeout;
    o.open_timeout = kOpenTimeout;
    o.name_field = "drafter_group";
    return transport::JoinGroup(o, &prepared->nccl_unique_id);
  }

  // The receiving side of the pair's feature channel (common/transport/feature_channel.h).
  absl::Status OpenChannel(transport::Transport t) {
    transport::FeatureChannelOptions o;
    o.transport = t;
    o.name = t == transport::Transport::kNccl ? ctx_.channel_descriptor : ctx_.channel;
    o.gpu = ctx_.gpu;
    o.slots = kChannelSlots;
    o.timeout = kChannelTimeout;
    o.open_timeout = kOpenTimeout;
    absl::StatusOr<std::unique_ptr<transport::FeatureReceiver>> channel =
        transport::FeatureReceiver::Create(o);
    if (!channel.ok()) return channel.status();
    std::lock_guard<std::mutex> lock(mu_);
    channel_ = *std::move(channel);
    if (aborted_) channel_->Abort();
    return absl::OkStatus();
  }

  // `last`: the step's last micro-batch, whose backward starts the gradient all-reduce.
  absl::Status TrainOn(const StepMicroBatch& mb, const transport::ReceivedFeatures& received,
                       bool last) {
    const transport::DecodedFeatures& d = received.decoded;
    const int64_t t = static_cast<int64_t>(d.batch.input_ids.size());
    if (d.feature_dim != drafter_->config().feature_dim()) {
      return absl::FailedPreconditionError(
          absl::StrCat("batch ", mb.batch_id, ": features are ", d.feature_dim,
                       " wide, the drafter expects ", drafter_->config().feature_dim()));
    }
    // The memory plan sized this drafter's activations for at most batching.max_anchors anchors
    // per micro-batch (the value it echoed): more would be a planning fault.
    if (static_cast<int64_t>(mb.anchors.size()) > max_anchors_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch ", mb.batch_id, ": ", mb.anchors.size(),
          " anchors, more than the batching.max_anchors of this run (", max_anchors_, ")"));
    }
    for (int32_t a : mb.anchors) {
      if (a < 0 || a >= t) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch ", mb.batch_id, ": anchor ", a, " is outside its ", t, " tokens"));
      }
    }
    at::TensorOptions options = at::TensorOptions().dtype(ScalarOf(d.dtype));
    at::Tensor features;
    if (received.on_device) {
      // Read in place (cuda_ipc: the target's slot; nccl: the channel's buffer) until Release.
      features = at::from_blob(const_cast<void*>(received.data), {t, d.feature_dim},
                               options.device(c10::Device(c10::DeviceType::CUDA, ctx_.gpu)));
    } else {
      // The ring slot is reused by the next batch: copy the features out before releasing it.
      features =
          at::from_blob(const_cast<void*>(received.data), {t, d.feature_dim}, options).clone();
    }
    return trainer_->AddMicroBatch(train::MakeDrafterBatch(d.batch, mb.anchors, features), last);
  }

  RunContext ctx_;
  train::LocalRunOptions options_;
  std::unique_ptr<drafter::DrafterModel> drafter_;
  std::unique_ptr<train::DrafterTrainer> trainer_;
  std::mutex mu_;
  bool aborted_ = false;
  std::string target_source_;  // where embed_tokens and lm_head came from (echoed)
  int64_t max_anchors_ = 0;    // batching.max_anchors: RunStep refuses more (echoed)
  std::unique_ptr<transport::FeatureReceiver> channel_;
  std::unique_ptr<transport::Communicator> comm_;  // data-parallel drafters only
};

}  // namespace

std::unique_ptr<StepRunner> NewDrafterRunner() { return std::make_unique<DrafterRunner>(); }

}  // namespace dflash::worker

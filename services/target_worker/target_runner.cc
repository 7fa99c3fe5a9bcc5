#include "services/target_worker/target_runner.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <sys/mman.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/batching/packed_batch.h"
#include "common/data/run_data.h"
#include "common/train/run_setup.h"
#include "common/transport/feature_message.h"
#include "common/transport/shm_ring.h"
#include "services/worker_common/feature_channel.h"

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
  absl::StatusOr<std::map<std::string, std::string>> Prepare(const RunContext& ctx) override {
    if (absl::Status s = CheckTransport(ctx.spec); !s.ok()) return s;
    ctx_ = ctx;
    const c10::Device device = ctx.gpu < 0 ? c10::Device(c10::DeviceType::CPU)
                                           : c10::Device(c10::DeviceType::CUDA, ctx.gpu);
    absl::StatusOr<std::unique_ptr<nn::TargetModel>> target =
        train::LoadRunTarget(ctx.spec, device);
    if (!target.ok()) return target.status();
    target_ = *std::move(target);
    absl::StatusOr<drafter::DrafterConfig> dc =
        train::RunDrafterConfig(ctx.spec, target_->config());
    if (!dc.ok()) return dc.status();
    absl::StatusOr<data::RunData> data = data::OpenRunData(ctx.spec, /*verify=*/true);
    if (!data.ok()) return data.status();
    data_ = std::make_unique<data::RunData>(*std::move(data));
    absl::StatusOr<transport::FeatureDType> ftype = FeatureType(target_->dtype());
    if (!ftype.ok()) return ftype.status();
    ftype_ = *ftype;
    transport::ShmRing::Options ro;
    ro.slots = kChannelSlots;
    ro.slot_bytes = transport::MaxFeatureMessageBytes(ctx.spec.batching.token_budget,
                                                      target_->feature_dim(), ftype_);
    // A channel of this name left behind by a crashed attempt is stale: names are per attempt.
    if (shm_unlink(("/" + ctx.channel).c_str()) == 0) {
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
                                  << ctx.channel << " (" << ro.slots << " x " << ro.slot_bytes
                                  << " bytes)";
    return train::RunSettings(ctx.spec, *dc);
  }

  absl::StatusOr<StepReport> RunStep(const StepWork& work) override {
    StepReport report;
    report.step = work.step;
    uint32_t chain = 0;
    for (const StepMicroBatch& mb : work.micro_batches) {
      absl::Status s = batching::MaterializeBatch(data_->source(), mb.pieces,
                                                  ctx_.spec.batching.token_budget, &scratch_);
      if (!s.ok()) return s;
      at::Tensor features;
      {
        const at::NoGradGuard no_grad;
        absl::StatusOr<at::Tensor> f = target_->Forward(AsTensor(scratch_.input_ids, at::kLong),
                                                        AsTensor(scratch_.positions, at::kLong),
                                                        AsTensor(scratch_.cu_seqlens, at::kInt));
        if (!f.ok()) return f.status();
        features = f->to(c10::Device(c10::DeviceType::CPU)).contiguous();
      }
      absl::StatusOr<uint32_t> crc = transport::EncodeFeatureMessage(
          scratch_, features.data_ptr(), target_->feature_dim(), ftype_, &message_);
      if (!crc.ok()) return crc.status();
      if (absl::Status sent = ring_->Send(mb.batch_id, message_, kChannelTimeout); !sent.ok()) {
        if (sent.code() == absl::StatusCode::kDeadlineExceeded) ring_->Abort();
        return absl::Status(sent.code(),
                            absl::StrCat("sending batch ", mb.batch_id, ": ", sent.message()));
      }
      chain = ChainChecksum(chain, *crc);
      report.tokens += static_cast<int64_t>(scratch_.input_ids.size());
      ++report.micro_batches;
    }
    report.checksum = chain;
    return report;
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ring_) ring_->Abort();
  }

 private:
  RunContext ctx_;
  std::unique_ptr<nn::TargetModel> target_;
  std::unique_ptr<data::RunData> data_;
  transport::FeatureDType ftype_ = transport::FeatureDType::kFloat32;
  std::mutex mu_;
  std::unique_ptr<transport::ShmRing> ring_;
  batching::PackedBatch scratch_;
  std::vector<uint8_t> message_;
};

}  // namespace

std::unique_ptr<StepRunner> NewTargetRunner() { return std::make_unique<TargetRunner>(); }

}  // namespace dflash::worker

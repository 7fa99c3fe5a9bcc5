#include "common/train/local_run.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>

#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/batching/anchors.h"
#include "common/batching/cursor.h"
#include "common/drafter/drafter_checkpoint.h"
#include "common/train/checkpoints.h"

namespace dflash::train {
namespace {

template <typename T>
at::Tensor AsLong(const std::vector<T>& v) {
  std::vector<int64_t> w(v.begin(), v.end());
  return at::tensor(at::ArrayRef<int64_t>(w), at::TensorOptions().dtype(at::kLong));
}

constexpr char kCursorKey[] = "data.cursor";

}  // namespace

drafter::DrafterBatch MakeDrafterBatch(const batching::PackedBatch& batch,
                                       const std::vector<int32_t>& anchors,
                                       const at::Tensor& features) {
  drafter::DrafterBatch out;
  out.features = features;
  out.input_ids = AsLong(batch.input_ids);
  out.positions = AsLong(batch.positions);
  out.cu_seqlens =
      at::tensor(at::ArrayRef<int32_t>(batch.cu_seqlens), at::TensorOptions().dtype(at::kInt));
  out.anchors = anchors.empty() ? AsLong(std::vector<int64_t>{-1}) : AsLong(anchors);
  out.loss_mask = AsLong(batch.loss_mask);
  return out;
}

absl::StatusOr<std::unique_ptr<LocalRun>> LocalRun::Create(const batching::DocumentSource* source,
                                                           const nn::TargetModel* target,
                                                           drafter::DrafterModel* drafter,
                                                           const LocalRunOptions& options,
                                                           const std::string& resume_from) {
  if (source == nullptr || target == nullptr || drafter == nullptr) {
    return absl::InvalidArgumentError("local run: source, target and drafter are required");
  }
  if (options.batching.num_pairs != 1) {
    return absl::InvalidArgumentError(absl::StrCat("local run: batching.num_pairs is ",
                                                   options.batching.num_pairs,
                                                   "; one process trains one pair"));
  }
  if (options.max_anchors < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching.max_anchors: must be >= 1, got ", options.max_anchors));
  }
  if (target->layer_ids() != drafter->config().target_layer_ids) {
    return absl::InvalidArgumentError(
        "local run: the target captures other layers than the drafter's target_layer_ids");
  }
  if (!options.init_from.empty() && resume_from.empty()) {
    if (absl::Status s = drafter::ImportDrafter(options.init_from, drafter); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("drafter.init_from: ", s.message()));
    }
  }
  std::unique_ptr<LocalRun> run(new LocalRun());
  run->source_ = source;
  run->target_ = target;
  run->drafter_ = drafter;
  run->options_ = options;
  absl::StatusOr<std::unique_ptr<DrafterTrainer>> trainer =
      DrafterTrainer::Create(drafter, options.optim, options.loss);
  if (!trainer.ok()) return trainer.status();
  run->trainer_ = *std::move(trainer);
  std::optional<batching::DataCursor> cursor;
  if (!resume_from.empty()) {
    absl::StatusOr<std::map<std::string, std::string>> meta = run->trainer_->LoadState(resume_from);
    if (!meta.ok()) return meta.status();
    auto it = meta->find(kCursorKey);
    if (it == meta->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(resume_from, ": no ", kCursorKey, " metadata: not a run checkpoint"));
    }
    absl::StatusOr<batching::DataCursor> parsed = batching::ParseCursor(it->second);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(resume_from, ": ", kCursorKey, ": ", parsed.status().message()));
    }
    cursor = *parsed;
  }
  absl::StatusOr<std::unique_ptr<batching::Batcher>> batcher =
      batching::Batcher::Create(source, options.batching, cursor ? &*cursor : nullptr);
  if (!batcher.ok()) return batcher.status();
  run->batcher_ = *std::move(batcher);
  return run;
}

absl::StatusOr<StepStats> LocalRun::Step() {
  absl::StatusOr<batching::StepPlan> plan = batcher_->NextStep();
  if (!plan.ok()) return plan.status();
  for (const batching::MicroBatchPlan& mb : plan->micro_batches) {
    absl::Status s =
        batching::MaterializeBatch(*source_, mb.pieces, options_.batching.token_budget, &scratch_);
    if (!s.ok()) return s;
    at::Tensor features;
    {
      const at::NoGradGuard no_grad;  // the target is frozen: features carry no graph
      absl::StatusOr<at::Tensor> f =
          target_->Forward(AsLong(scratch_.input_ids), AsLong(scratch_.positions),
                           at::tensor(at::ArrayRef<int32_t>(scratch_.cu_seqlens),
                                      at::TensorOptions().dtype(at::kInt)));
      if (!f.ok()) return f.status();
      features = *std::move(f);
    }
    absl::StatusOr<std::vector<int32_t>> anchors = batching::SampleAnchors(
        scratch_.loss_mask, scratch_.doc_ids, options_.max_anchors, mb.anchor_seed);
    if (!anchors.ok()) return anchors.status();
    s = trainer_->AddMicroBatch(MakeDrafterBatch(scratch_, *anchors, features));
    if (!s.ok()) return s;
  }
  absl::StatusOr<StepStats> stats = trainer_->Step();
  if (!stats.ok()) return stats;
  const int64_t done = trainer_->step();
  if (!options_.checkpoint_dir.empty() && options_.checkpoint_every > 0 &&
      (done % options_.checkpoint_every == 0 || done == options_.optim.total_steps)) {
    std::error_code ec;
    std::filesystem::create_directories(options_.checkpoint_dir, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat(options_.checkpoint_dir, ": cannot create: ", ec.message()));
    }
    if (absl::Status c = SaveCheckpoint(CheckpointPath(options_.checkpoint_dir, done)); !c.ok()) {
      return c;
    }
    if (absl::Status c = PruneCheckpoints(options_.checkpoint_dir, options_.checkpoint_keep);
        !c.ok()) {
      return c;
    }
  }
  return stats;
}

absl::Status LocalRun::SaveCheckpoint(const std::string& path) const {
  return trainer_->SaveState(path, {{kCursorKey, batching::SerializeCursor(batcher_->cursor())}});
}

}  // namespace dflash::train

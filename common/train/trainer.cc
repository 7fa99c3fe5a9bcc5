#include "common/train/trainer.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/model/safetensors.h"
#include "common/nn/torch_status.h"
#include "common/nn/weights.h"
#include "common/train/grad_reducer.h"

namespace dflash::train {
namespace {

absl::Status FieldError(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("optimizer: ", field, ": ", why));
}

std::string ShapeOf(const at::Tensor& t) { return nn::ShapeString(t.sizes().vec()); }

}  // namespace

absl::Status ValidateOptimConfig(const OptimConfig& c) {
  if (!(c.lr > 0) || !std::isfinite(c.lr)) return FieldError("lr", "must be a positive number");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return FieldError("beta1", "must be in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return FieldError("beta2", "must be in [0, 1)");
  if (!(c.eps > 0)) return FieldError("eps", "must be positive");
  if (!(c.weight_decay >= 0)) return FieldError("weight_decay", "must be >= 0");
  if (!(c.warmup_ratio >= 0 && c.warmup_ratio < 1)) {
    return FieldError("warmup_ratio", "must be in [0, 1)");
  }
  if (std::isnan(c.clip_norm)) return FieldError("clip_norm", "is NaN");
  if (c.total_steps < 1) return FieldError("total_steps", "must be at least 1");
  return absl::OkStatus();
}

double LearningRate(const OptimConfig& c, int64_t step) {
  const int64_t warmup =
      static_cast<int64_t>(std::ceil(c.warmup_ratio * static_cast<double>(c.total_steps)));
  if (step < warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay = std::max<int64_t>(1, c.total_steps - warmup);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay));
  switch (c.schedule) {
    case LrSchedule::kLinear:
      return c.lr * (1.0 - progress);
    case LrSchedule::kConstant:
      return c.lr;
    case LrSchedule::kCosine:
      break;
  }
  return c.lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

// AdamW state per parameter, in fp32 on the parameter's device: the two moments and the step
// count (a one-element fp32 tensor, as ATen's fused AdamW wants it).
struct DrafterTrainer::Impl {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> exp_avg, exp_avg_sq, steps;
  double numerator = 0, weight_sum = 0;
  bool nonfinite = false;
  int64_t micro = 0;
  std::vector<int64_t> slot_correct, slot_total;
  std::unique_ptr<GradReducer> reducer;  // with a communicator
  int64_t oom_splits = 0;                // this step's
};

namespace {

// The micro-batch's documents in two halves (the first ceil(d/2) documents and the rest) with
// their rows, features and anchors (padding anchors dropped: they carry no weight); nullopt for a
// single document. Anchors and their blocks stay inside their documents, so each half trains its
// anchors on exactly the context they had.
std::optional<std::pair<drafter::DrafterBatch, drafter::DrafterBatch>> SplitByDocuments(
    const drafter::DrafterBatch& b) {
  const at::Tensor cu = b.cu_seqlens.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t docs = cu.numel() - 1;
  if (docs < 2) return std::nullopt;
  const int64_t mid = (docs + 1) / 2;
  const int64_t* c = cu.data_ptr<int64_t>();
  const int64_t t1 = c[mid], t = c[docs];
  std::pair<drafter::DrafterBatch, drafter::DrafterBatch> out;
  for (auto [half, from, n] :
       {std::make_tuple(&out.first, int64_t{0}, t1), std::make_tuple(&out.second, t1, t - t1)}) {
    half->features = b.features.narrow(0, from, n);
    half->input_ids = b.input_ids.narrow(0, from, n);
    half->positions = b.positions.narrow(0, from, n);
    half->loss_mask = b.loss_mask.narrow(0, from, n);
  }
  out.first.cu_seqlens = cu.narrow(0, 0, mid + 1).to(b.cu_seqlens.options());
  out.second.cu_seqlens = (cu.narrow(0, mid, docs - mid + 1) - t1).to(b.cu_seqlens.options());
  const at::Tensor anchors = b.anchors.to(at::kCPU).to(at::kLong).contiguous();
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < anchors.numel(); ++i) {
    const int64_t a = anchors.data_ptr<int64_t>()[i];
    if (a >= 0) (a < t1 ? first : second).push_back(a < t1 ? a : a - t1);
  }
  for (auto [half, list] :
       {std::make_pair(&out.first, &first), std::make_pair(&out.second, &second)}) {
    if (list->empty()) list->push_back(-1);  // a padding block: no anchor in this half
    half->anchors = at::tensor(at::ArrayRef<int64_t>(*list), at::TensorOptions().dtype(at::kLong))
                        .to(b.anchors.device());
  }
  return out;
}

}  // namespace

DrafterTrainer::DrafterTrainer(drafter::DrafterModel* model, OptimConfig config,
                               drafter::LossOptions loss)
    : model_(model), config_(config), loss_(loss), impl_(std::make_unique<Impl>()) {}

DrafterTrainer::~DrafterTrainer() = default;

absl::StatusOr<std::unique_ptr<DrafterTrainer>> DrafterTrainer::Create(
    drafter::DrafterModel* model, const OptimConfig& config, const drafter::LossOptions& loss,
    transport::Communicator* comm) {
  if (model == nullptr) return absl::InvalidArgumentError("trainer: no model");
  if (absl::Status s = ValidateOptimConfig(config); !s.ok()) return s;
  std::unique_ptr<DrafterTrainer> t(new DrafterTrainer(model, config, loss));
  t->comm_ = comm != nullptr && comm->world() > 1 ? comm : nullptr;
  for (const drafter::NamedParameter& p : model->parameters()) {
    if (p.tensor.scalar_type() != at::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trainer: parameter ", p.name, " is ", std::string(c10::toString(p.tensor.scalar_type())),
          "; AdamW keeps fp32 master weights (DrafterOptions.dtype = fp32)"));
    }
    t->impl_->params.push_back(p.tensor);
    t->impl_->exp_avg.push_back(at::zeros_like(p.tensor));
    t->impl_->exp_avg_sq.push_back(at::zeros_like(p.tensor));
    t->impl_->steps.push_back(at::zeros({}, p.tensor.options()));
  }
  if (t->comm_ != nullptr) {
    t->impl_->reducer = std::make_unique<GradReducer>(t->impl_->params, t->comm_);
  }
  const size_t b = static_cast<size_t>(model->config().block_size);
  t->impl_->slot_correct.assign(b, 0);
  t->impl_->slot_total.assign(b, 0);
  return t;
}

absl::Status DrafterTrainer::AddMicroBatch(const drafter::DrafterBatch& batch, bool last_in_step) {
  Impl& m = *impl_;
  // The step's first micro-batch without a data-parallel group: the gradients hold nothing but its
  // own pieces, so a backward that runs out of memory after some were added can start the
  // micro-batch over, in pieces of half the size.
  const bool restartable = m.micro == 0 && comm_ == nullptr;
  for (int depth = 0;; ++depth) {
    bool restart = false;
    absl::Status s = AddPieces(batch, last_in_step, depth, restartable, &restart);
    if (!restart) return s;
    for (at::Tensor& p : m.params) p.mutable_grad() = at::Tensor();
    m.numerator = m.weight_sum = 0;
    m.nonfinite = false;
    std::fill(m.slot_correct.begin(), m.slot_correct.end(), 0);
    std::fill(m.slot_total.begin(), m.slot_total.end(), 0);
    m.micro = 0;
    ++m.oom_splits;
    LOG(WARNING) << "out of memory in the drafter's backward after earlier pieces of the "
                 << batch.input_ids.size(0) << "-token micro-batch: " << s.message()
                 << "; training it again in pieces of at most 1/" << (int64_t{2} << depth)
                 << " of its documents";
  }
}

absl::Status DrafterTrainer::AddPieces(const drafter::DrafterBatch& batch, bool last_in_step,
                                       int depth, bool restartable, bool* restart) {
  Impl& m = *impl_;
  if (depth > 0) {
    if (auto halves = SplitByDocuments(batch)) {
      RETURN_IF_ERROR(AddPieces(halves->first, false, depth - 1, restartable, restart));
      return AddPieces(halves->second, last_in_step, depth - 1, restartable, restart);
    }
  }
  bool in_backward = false;
  absl::Status s = TryMicroBatch(batch, last_in_step, &in_backward);
  if (s.code() != absl::StatusCode::kResourceExhausted) return s;
  if (in_backward && (m.micro > 0 || comm_ != nullptr)) {
    if (restartable && SplitByDocuments(batch).has_value()) {
      *restart = true;  // AddMicroBatch starts over in smaller pieces
      return s;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(), "; not recoverable: the backward had begun adding to gradients that hold ",
        comm_ != nullptr ? "the step's all-reduce" : "earlier micro-batches of the step",
        restartable ? " (and this piece is one document)" : ""));
  }
  // The first micro-batch's backward: its gradients were all this micro-batch's.
  if (in_backward) {
    for (at::Tensor& p : m.params) p.mutable_grad() = at::Tensor();
  }
  std::optional<std::pair<drafter::DrafterBatch, drafter::DrafterBatch>> halves =
      SplitByDocuments(batch);
  if (!halves) {
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(), "; not recoverable: the micro-batch is one document of ",
        batch.input_ids.size(0), " tokens (lower data.max_length or batching.token_budget)"));
  }
  ++m.oom_splits;
  LOG(WARNING) << "out of memory in the drafter's " << (in_backward ? "backward" : "forward")
               << " on a micro-batch of " << batch.input_ids.size(0) << " tokens ("
               << batch.cu_seqlens.size(0) - 1 << " documents): " << s.message()
               << "; training its halves";
  RETURN_IF_ERROR(AddPieces(halves->first, false, 0, restartable, restart));
  return AddPieces(halves->second, last_in_step, 0, restartable, restart);
}

absl::Status DrafterTrainer::TryMicroBatch(const drafter::DrafterBatch& batch, bool last_in_step,
                                           bool* in_backward) {
  if (inject_oom_above_ > 0 && batch.input_ids.size(0) > inject_oom_above_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("injected out of memory (test hook): ", batch.input_ids.size(0),
                     " rows above ", inject_oom_above_));
  }
  const bool fail_backward =
      inject_backward_oom_above_ > 0 && batch.input_ids.size(0) > inject_backward_oom_above_;
  absl::StatusOr<at::Tensor> hidden = model_->Forward(batch);
  if (!hidden.ok()) return hidden.status();
  drafter::LossOptions options = loss_;  // the selector loss's factor at this step
  options.selector_loss_alpha = drafter::SelectorAlphaAt(loss_, step_);
  absl::StatusOr<drafter::DrafterLoss> loss = model_->Loss(batch, *hidden, options);
  if (!loss.ok()) return loss.status();
  double num = 0;
  try {
    num = loss->numerator.item<double>();  // the read back waits for the loss's device work
  } catch (const c10::Error& e) {
    return nn::TorchStatus(e, "drafter loss (read back)");
  }
  Impl& m = *impl_;
  const bool overlap = last_in_step && m.reducer != nullptr;
  if (overlap) m.reducer->Arm();
  if (std::isfinite(num)) {
    *in_backward = true;
    try {
      loss->numerator.backward();
    } catch (const c10::Error& e) {
      return nn::TorchStatus(e, "drafter backward");
    }
    if (fail_backward) {  // after its gradients were added: the worst case
      return absl::ResourceExhaustedError(absl::StrCat(
          "injected out of memory in the backward (test hook): ", batch.input_ids.size(0),
          " rows above ", inject_backward_oom_above_));
    }
  } else {
    m.nonfinite = true;  // the step will be skipped: no use propagating NaN into the gradients
  }
  // Every rank starts every bucket, in order, whether its backward reached it or not.
  if (overlap) {
    if (absl::Status s = m.reducer->Flush(); !s.ok()) return s;
  }
  // The reads back, before anything is added to the step's sums: a failure here (still counted
  // as in the backward, whose gradients are in place) leaves the sums as they were.
  double weight = 0;
  at::Tensor correct, total;
  try {
    weight = loss->denominator.item<double>();
    correct = loss->slot_correct.to(at::kCPU).contiguous();
    total = loss->slot_total.to(at::kCPU).contiguous();
  } catch (const c10::Error& e) {
    return nn::TorchStatus(e, "drafter loss statistics (read back)");
  }
  *in_backward = false;
  m.numerator += num;
  m.weight_sum += weight;
  for (size_t k = 0; k < m.slot_correct.size(); ++k) {
    m.slot_correct[k] += correct.data_ptr<int64_t>()[k];
    m.slot_total[k] += total.data_ptr<int64_t>()[k];
  }
  ++m.micro;
  return absl::OkStatus();
}

absl::Status DrafterTrainer::ReduceScalars() {
  Impl& m = *impl_;
  const size_t b = m.slot_correct.size();
  std::vector<double> v = {m.numerator, m.weight_sum, m.nonfinite ? 1.0 : 0.0};
  v.insert(v.end(), m.slot_correct.begin(), m.slot_correct.end());
  v.insert(v.end(), m.slot_total.begin(), m.slot_total.end());
  if (absl::Status s = comm_->AllReduceSum(v.data(), v.size(), transport::ReduceType::kFloat64,
                                           /*device_memory=*/false);
      !s.ok()) {
    return s;
  }
  m.numerator = v[0];
  m.weight_sum = v[1];
  m.nonfinite = v[2] > 0;
  for (size_t k = 0; k < b; ++k) {  // counts below 2^53: exact in doubles
    m.slot_correct[k] = static_cast<int64_t>(v[3 + k]);
    m.slot_total[k] = static_cast<int64_t>(v[3 + b + k]);
  }
  return absl::OkStatus();
}

absl::Status DrafterTrainer::ReduceGradients() {
  // The buckets a last_in_step backward started are finished; all of them otherwise.
  return impl_->reducer->Finish();
}

// The optimizer's half of Step: the global gradient norm, clipping and the fused AdamW update (or
// skipped for a non-finite norm). A LibTorch error, an out-of-memory included, is a status; the
// parameters may then be part-updated, so the run goes back to its last checkpoint.
absl::Status DrafterTrainer::ApplyOptimizer(StepStats* stats) {
  Impl& m = *impl_;
  StepStats& s = *stats;
  try {
    // The gradients hold the step's loss numerator's: one norm pass gives the global norm of the
    // normalized gradient (/ weight sum), and the normalization and the clipping are folded into
    // the fused AdamW's grad_scale (it divides each gradient by it as it reads it), so the
    // gradients are read twice in all instead of being rewritten twice first.
    const at::NoGradGuard no_grad;
    std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (!m.params[i].grad().defined()) continue;  // untouched this step: not updated
      params.push_back(m.params[i]);
      grads.push_back(m.params[i].grad());
      exp_avg.push_back(m.exp_avg[i]);
      exp_avg_sq.push_back(m.exp_avg_sq[i]);
      steps.push_back(m.steps[i]);
    }
    const double raw_norm =
        grads.empty() ? 0.0 : at::stack(at::_foreach_norm(grads, 2)).norm().item<double>();
    s.grad_norm = raw_norm / s.weight_sum;
    s.skipped = !std::isfinite(s.grad_norm);
    if (!s.skipped && !grads.empty()) {
      // As clip_grad_norm_: coefficient max_norm / (norm + 1e-6), at most 1.
      const double clip =
          config_.clip_norm > 0 ? std::min(1.0, config_.clip_norm / (s.grad_norm + 1e-6)) : 1.0;
      const at::Tensor grad_scale =
          at::full({}, s.weight_sum / clip, grads[0].options().dtype(at::kFloat));
      s.lr = LearningRate(config_, step_);
      at::_foreach_add_(steps, 1.0);
      at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, s.lr,
                        config_.beta1, config_.beta2, config_.weight_decay, config_.eps,
                        /*amsgrad=*/false, /*maximize=*/false, grad_scale, /*found_inf=*/{});
    }

  } catch (const c10::Error& e) {
    return nn::TorchStatus(e, "optimizer step");
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> DrafterTrainer::Step(std::optional<double> global_weight_sum) {
  Impl& m = *impl_;
  if (m.micro == 0) return absl::FailedPreconditionError("trainer: Step() without a micro-batch");
  if (comm_ != nullptr) {
    // Gradients first, then the scalars, on every rank: the order the overlapped backward starts
    // them in. A step that turns out skipped has reduced its gradients for nothing.
    if (absl::Status st = ReduceGradients(); !st.ok()) return st;
    if (absl::Status st = ReduceScalars(); !st.ok()) return st;
  }
  StepStats s;
  s.step = step_;
  s.micro_batches = m.micro;
  s.oom_splits = m.oom_splits;
  s.weight_sum = comm_ != nullptr ? m.weight_sum : global_weight_sum.value_or(m.weight_sum);
  s.loss = s.weight_sum > 0 ? m.numerator / s.weight_sum : 0.0;
  s.slot_correct = m.slot_correct;
  s.slot_total = m.slot_total;
  s.acceptance_length = drafter::ExpectedAcceptanceLength(m.slot_correct, m.slot_total);
  s.skipped = m.nonfinite || !(s.weight_sum > 0) || !std::isfinite(s.loss);
  s.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (!s.skipped) {
    absl::Status applied = ApplyOptimizer(&s);
    if (!applied.ok()) return applied;
  }
  if (s.skipped) ++skipped_;
  for (at::Tensor& p : m.params) p.mutable_grad() = at::Tensor();
  m.numerator = m.weight_sum = 0;
  m.nonfinite = false;
  m.micro = 0;
  m.oom_splits = 0;
  std::fill(m.slot_correct.begin(), m.slot_correct.end(), 0);
  std::fill(m.slot_total.begin(), m.slot_total.end(), 0);
  ++step_;
  return s;
}

absl::Status DrafterTrainer::SaveState(
    const std::string& path, const std::map<std::string, std::string>& extra_metadata) const {
  const Impl& m = *impl_;
  std::vector<at::Tensor> keep;  // CPU copies alive until written
  std::vector<model::TensorToWrite> out;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    keep.push_back(c);
    model::TensorToWrite w;
    w.name = name;
    w.dtype = c.scalar_type() == at::kLong ? model::DType::kI64 : model::DType::kF32;
    w.shape = c.sizes().vec();
    w.data = c.data_ptr();
    w.nbytes = c.nbytes();
    out.push_back(std::move(w));
  };
  keep.reserve(4 * m.params.size());
  const auto& specs = model_->parameters();
  for (size_t i = 0; i < specs.size(); ++i) {
    const at::Tensor& p = m.params[i];
    const std::string& name = specs[i].name;
    add("param/" + name, p);
    add("adam.exp_avg/" + name, m.exp_avg[i]);
    add("adam.exp_avg_sq/" + name, m.exp_avg_sq[i]);
    add("adam.step/" + name,
        at::full({1}, static_cast<int64_t>(std::llround(m.steps[i].item<double>())), at::kLong));
  }
  std::map<std::string, std::string> meta = extra_metadata;
  meta["trainer.step"] = std::to_string(step_);
  meta["trainer.skipped"] = std::to_string(skipped_);
  return model::WriteSafetensors(path, out, meta);
}

absl::StatusOr<std::map<std::string, std::string>> DrafterTrainer::LoadState(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<model::SafetensorsFile>> file = model::SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  const std::map<std::string, std::string> meta = (*file)->header().metadata;
  absl::StatusOr<std::map<std::string, at::Tensor>> tensors = nn::ReadTensorFile(path);
  if (!tensors.ok()) return tensors.status();
  int64_t step = 0, skipped = 0;
  try {
    step = std::stoll(meta.at("trainer.step"));
    skipped = std::stoll(meta.at("trainer.skipped"));
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": metadata trainer.step / trainer.skipped missing or not integers"));
  }
  Impl& m = *impl_;
  const auto& specs = model_->parameters();
  // Check everything before changing anything.
  for (size_t i = 0; i < specs.size(); ++i) {
    for (const char* kind : {"param/", "adam.exp_avg/", "adam.exp_avg_sq/", "adam.step/"}) {
      const std::string name = kind + specs[i].name;
      auto it = tensors->find(name);
      if (it == tensors->end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " is missing"));
      }
      const bool is_step = std::strcmp(kind, "adam.step/") == 0;
      const at::Tensor& t = it->second;
      const bool ok = is_step ? (t.scalar_type() == at::kLong && t.numel() == 1)
                              : (t.scalar_type() == at::kFloat && t.sizes() == m.params[i].sizes());
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor ", name, " is ", std::string(c10::toString(t.scalar_type())), " ",
            ShapeOf(t), ", expected ", is_step ? "int64 [1]" : "fp32 " + ShapeOf(m.params[i])));
      }
    }
  }
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor& p = m.params[i];
    const std::string& name = specs[i].name;
    p.copy_(tensors->at("param/" + name));
    m.exp_avg[i].copy_(tensors->at("adam.exp_avg/" + name));
    m.exp_avg_sq[i].copy_(tensors->at("adam.exp_avg_sq/" + name));
    m.steps[i].fill_(static_cast<double>(tensors->at("adam.step/" + name).item<int64_t>()));
    p.mutable_grad() = at::Tensor();
  }
  step_ = step;
  skipped_ = skipped;
  m.numerator = m.weight_sum = 0;
  m.nonfinite = false;
  m.micro = 0;
  std::fill(m.slot_correct.begin(), m.slot_correct.end(), 0);
  std::fill(m.slot_total.begin(), m.slot_total.end(), 0);
  return meta;
}

}  // namespace dflash::train

#include "common/train/grad_reducer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <utility>

namespace dflash::train {
namespace {

class ReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(GradReducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { reducer_->OnGradient(index_); }

 private:
  GradReducer* reducer_;
  size_t index_;
};

}  // namespace

GradReducer::GradReducer(std::vector<at::Tensor> params, transport::Communicator* comm,
                         int64_t bucket_bytes)
    : params_(std::move(params)), comm_(comm), bucket_of_(params_.size()) {
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    if (buckets_.empty() || bytes >= bucket_bytes) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += params_[k].numel() * static_cast<int64_t>(params_[k].element_size());
  }
  missing_.assign(buckets_.size(), 0);
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[k],
                                                   std::make_unique<ReadyHook>(this, k));
  }
}

GradReducer::~GradReducer() {
  for (const at::Tensor& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradReducer::Arm() {
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].size();
  flat_.assign(buckets_.size(), at::Tensor());
  next_ = 0;
  started_in_backward_ = 0;
  error_ = absl::OkStatus();
  armed_ = true;
}

void GradReducer::OnGradient(size_t index) {
  if (!armed_ || flushing_ || !error_.ok()) return;
  const size_t b = bucket_of_[index];
  if (missing_[b] > 0) --missing_[b];
  // In order only: a bucket that fills early waits for the ones before it.
  while (next_ < buckets_.size() && missing_[next_] == 0 && error_.ok()) {
    error_ = Start(next_);
    ++next_;
    ++started_in_backward_;
  }
}

absl::Status GradReducer::Start(size_t bucket) {
  const at::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  for (size_t k : buckets_[bucket]) {
    at::Tensor& p = params_[k];
    // A parameter no micro-batch of this rank reached takes part with zeros.
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    parts.push_back(p.grad().reshape({-1}));
  }
  flat_[bucket] = at::cat(parts).contiguous();
  const at::Tensor& f = flat_[bucket];
  return comm_->StartAllReduceSum(f.data_ptr(), static_cast<size_t>(f.numel()),
                                  transport::ReduceType::kFloat32, f.is_cuda());
}

absl::Status GradReducer::Flush() {
  if (!armed_) Arm();
  flushing_ = true;
  while (next_ < buckets_.size() && error_.ok()) {
    error_ = Start(next_);
    ++next_;
  }
  flushing_ = false;
  return error_;
}

absl::Status GradReducer::Finish() {
  absl::Status s = Flush();
  if (s.ok()) s = comm_->WaitStarted();
  armed_ = false;
  if (!s.ok()) {
    flat_.clear();
    return s;
  }
  const at::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t offset = 0;
    for (size_t k : buckets_[b]) {
      at::Tensor& g = params_[k].mutable_grad();
      g.copy_(flat_[b].narrow(0, offset, g.numel()).view(g.sizes()));
      offset += g.numel();
    }
  }
  flat_.clear();
  return absl::OkStatus();
}

}  // namespace dflash::train

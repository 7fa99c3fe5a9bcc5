// The gradient all-reduce among data-parallel drafters, bucketed and
// overlapped with the backward where LibTorch allows: a post-accumulate-grad hook on every
// parameter counts the gradients of the step's last backward as they land; a bucket (about 32 MiB
// of whole gradients, in reverse parameter order, i.e. roughly the order the backward produces
// them) is flattened and its sum started (Communicator::StartAllReduceSum) as soon as it is full
// and every bucket before it has been started, so that every rank starts the same reductions in
// the same order. Flush() starts whatever the backward did not reach (a gradient no micro-batch
// of this rank produced takes part as zeros; a rank that skipped its backward starts them all),
// Finish() waits for them and writes the sums back into the gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/transport/communicator.h"

namespace dflash::train {

class GradReducer {
 public:
  static constexpr int64_t kBucketBytes = int64_t{32} << 20;

  // `params`: leaf tensors requiring gradients, kept alive by their model beyond the reducer.
  GradReducer(std::vector<at::Tensor> params, transport::Communicator* comm,
              int64_t bucket_bytes = kBucketBytes);
  ~GradReducer();  // removes the hooks
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The next backward is the step's last: its hooks start buckets as they fill.
  void Arm();
  // Starts every bucket not started yet, in order. Returns the first error of a hook, if any.
  absl::Status Flush();
  // Waits for the started buckets and writes the sums into the gradients; disarms.
  absl::Status Finish();
  bool armed() const { return armed_; }
  size_t num_buckets() const { return buckets_.size(); }
  // Buckets started from inside a backward, since the last Arm() (how much overlapped).
  size_t started_in_backward() const { return started_in_backward_; }

  // Called by the hooks: the gradient of params_[index] has been accumulated.
  void OnGradient(size_t index);

 private:
  absl::Status Start(size_t bucket);

  std::vector<at::Tensor> params_;
  transport::Communicator* comm_;
  std::vector<std::vector<size_t>> buckets_;  // parameter indices, in reverse parameter order
  std::vector<size_t> bucket_of_;
  std::vector<size_t> missing_;   // per bucket: gradients not yet accumulated
  std::vector<at::Tensor> flat_;  // per started bucket: its flattened gradients
  size_t next_ = 0;               // the next bucket to start
  size_t started_in_backward_ = 0;
  bool armed_ = false, flushing_ = false;
  absl::Status error_;
};

}  // namespace dflash::train

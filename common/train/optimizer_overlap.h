// The optimizer step overlapped with the next forward (docs/method.md §4): AdamW
// is memory-bound (it reads and writes ~28 bytes per parameter), the forward's GEMMs are
// compute-bound, so on a CUDA device the update runs on a side stream, one parameter group at a
// time (DrafterModel::ParameterGroup: the tensors outside the layers, then each layer), and the
// model's next forward waits for each group only when it reaches it (drafter::ParameterFence).
// Every other reader of the parameters (the loss, checkpoints, export, evaluation) waits for all
// groups. The update's arithmetic is the same kernels on the same tensors: the same values.
//
// Global-norm clipping needs every gradient before any update, so the update cannot start during
// the backward; it overlaps the next step's forward instead.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <vector>

#include "common/drafter/drafter_model.h"

namespace dflash::train {

class OptimizerOverlap : public drafter::ParameterFence {
 public:
  // nullptr where there is nothing to overlap with: a device other than CUDA, or a build
  // without LibTorch's CUDA support.
  static std::unique_ptr<OptimizerOverlap> Create(c10::Device device, int64_t groups);
  ~OptimizerOverlap() override;

  // Queues update(g) for g = 0 .. groups - 1 on the side stream, after everything queued so far
  // on the current stream; `used` (the gradients, the scale: tensors the current stream made) are
  // kept from reuse by the allocator until the side stream is done with them.
  void Run(const std::function<void(int64_t group)>& update, const std::vector<at::Tensor>& used);
  void Await(int64_t group) const override;

 private:
  struct Impl;
  explicit OptimizerOverlap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash::train

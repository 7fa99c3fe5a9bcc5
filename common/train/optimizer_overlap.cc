#include "common/train/optimizer_overlap.h"

#ifdef DFLASH_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <utility>

namespace dflash::train {

#ifdef DFLASH_HAVE_TORCH_CUDA

struct OptimizerOverlap::Impl {
  c10::Device device;
  c10::cuda::CUDAStream side;
  c10::cuda::CUDAEvent ready;              // the current stream's work before the update
  std::vector<c10::cuda::CUDAEvent> done;  // per group: its update, on the side stream
};

std::unique_ptr<OptimizerOverlap> OptimizerOverlap::Create(c10::Device device, int64_t groups) {
  if (!device.is_cuda() || groups < 1) return nullptr;
  const c10::cuda::CUDAGuard guard(device);
  auto impl = std::unique_ptr<Impl>(new Impl{
      device,
      c10::cuda::getStreamFromPool(/*isHighPriority=*/false, guard.current_device().index()),
      c10::cuda::CUDAEvent(), std::vector<c10::cuda::CUDAEvent>(static_cast<size_t>(groups))});
  return std::unique_ptr<OptimizerOverlap>(new OptimizerOverlap(std::move(impl)));
}

void OptimizerOverlap::Run(const std::function<void(int64_t group)>& update,
                           const std::vector<at::Tensor>& used) {
  Impl& m = *impl_;
  const c10::cuda::CUDAGuard guard(m.device);
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(m.device.index());
  m.ready.record(main);
  m.ready.block(m.side);
  for (const at::Tensor& t : used) {
    if (t.defined() && t.is_cuda()) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), m.side);
    }
  }
  {
    const c10::cuda::CUDAStreamGuard on_side(m.side);
    for (size_t g = 0; g < m.done.size(); ++g) {
      update(static_cast<int64_t>(g));
      m.done[g].record(m.side);
    }
  }
}

void OptimizerOverlap::Await(int64_t group) const {
  Impl& m = *impl_;  // recording nothing: CUDAEvent::block is not const
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(m.device.index());
  if (group == kAllGroups) {
    for (c10::cuda::CUDAEvent& e : m.done) e.block(current);  // no-op before a first record
  } else if (group >= 0 && static_cast<size_t>(group) < m.done.size()) {
    m.done[static_cast<size_t>(group)].block(current);
  }
}

#else  // without LibTorch's CUDA support there is no stream to overlap on: Create gives nullptr

struct OptimizerOverlap::Impl {};

std::unique_ptr<OptimizerOverlap> OptimizerOverlap::Create(c10::Device, int64_t) { return nullptr; }

void OptimizerOverlap::Run(const std::function<void(int64_t group)>& update,
                           const std::vector<at::Tensor>&) {
  (void)update;
}

void OptimizerOverlap::Await(int64_t) const {}

#endif

OptimizerOverlap::OptimizerOverlap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OptimizerOverlap::~OptimizerOverlap() = default;

}  // namespace dflash::train

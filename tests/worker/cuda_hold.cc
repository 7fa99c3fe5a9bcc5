#include "tests/worker/cuda_hold.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

namespace dflash::testing {

std::shared_ptr<void> HoldCudaBytes(int gpu, int64_t bytes) {
  auto* t = new at::Tensor(at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(
                                                  c10::Device(c10::DeviceType::CUDA, gpu))));
  return std::shared_ptr<void>(t, [](void* p) { delete static_cast<at::Tensor*>(p); });
}

}  // namespace dflash::testing

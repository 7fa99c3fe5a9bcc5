// The scale-aware error every numeric test of the project uses: max |got - want| / max |want| in
// fp64 on the CPU (the plain max |got - want| when want is all zeros); and ||got - want|| /
// ||want|| (Frobenius norms) where a few rounding flips of a coarse format must not decide the
// comparison.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

namespace dflash::testing {

inline double MaxRelError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor x = got.detach().to(at::kCPU, at::kDouble);
  const at::Tensor y = want.detach().to(at::kCPU, at::kDouble);
  const double scale = y.abs().max().item<double>();
  const double diff = (x - y).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

inline double NormRelError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor x = got.detach().to(at::kCPU, at::kDouble);
  const at::Tensor y = want.detach().to(at::kCPU, at::kDouble);
  const double scale = y.norm().item<double>();
  const double diff = (x - y).norm().item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace dflash::testing

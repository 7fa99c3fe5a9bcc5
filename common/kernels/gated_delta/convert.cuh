// Loads and stores of the packed tensors' dtypes as fp32, and the launchers' dispatch over key
// head dims and dtypes (the gated delta rule's kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/kernels/float_convert.cuh"
#include "common/kernels/gated_delta/params.h"

namespace dflash::kernels::gdr {

using kernels::FromFloat;  // common/kernels/float_convert.cuh, also as gdr::
using kernels::ToFloat;

// Returns fn(std::integral_constant<int, DK>, T{}) for DK in {64, 128, 256} and T the element
// type of `dtype`, or cudaErrorInvalidValue for another dk.
template <typename Fn>
int DispatchDkAndDtype(int64_t dk, ScanDType dtype, Fn&& fn) {
  auto by_dtype = [&](auto dk_constant) -> int {
    switch (dtype) {
      case ScanDType::kFloat32:
        return fn(dk_constant, float{});
      case ScanDType::kBFloat16:
        return fn(dk_constant, __nv_bfloat16{});
      case ScanDType::kFloat16:
        return fn(dk_constant, __half{});
    }
    return static_cast<int>(cudaErrorInvalidValue);
  };
  switch (dk) {
    case 64:
      return by_dtype(std::integral_constant<int, 64>{});
    case 128:
      return by_dtype(std::integral_constant<int, 128>{});
    case 256:
      return by_dtype(std::integral_constant<int, 256>{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace dflash::kernels::gdr

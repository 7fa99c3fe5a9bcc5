// The kernel switches of the benchmarks (DFLASH_FUSED_ROPE, DFLASH_FUSED_SWIGLU, ...;
// services/worker_common/kernel_overrides.h lists them): a fused kernel stays on unless its
// variable is "0". Each binding reads its variable once (a function-local static).
#pragma once

#include <cstdlib>
#include <cstring>

namespace dflash::kernels {

inline bool EnvSwitchOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace dflash::kernels

// A LibTorch CUDA allocation held by a test, behind a plain header: LibTorch's headers and the
// generated protobuf headers must not meet in one translation unit.
#pragma once

#include <cstdint>
#include <memory>

namespace dflash::testing {

// `bytes` bytes allocated through LibTorch's caching allocator on `gpu`, freed (back to the
// cache) when the returned handle goes.
std::shared_ptr<void> HoldCudaBytes(int gpu, int64_t bytes);

}  // namespace dflash::testing

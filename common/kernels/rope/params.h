// Rotary position embedding in one pass (common/kernels/rope/rope.h): the plain struct shared by
// the launcher (rope_launch.cu) and the LibTorch binding (rope.cc).
#pragma once

#include <cstdint>

namespace dflash::kernels {

enum class RopeDType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// x, out [rows, heads, dim] contiguous; cos, sin [rows, dim] contiguous; all of `dtype`. Forward:
//   out[:h] = x[:h] cos[:h] - x[h:] sin[:h],  out[h:] = x[h:] cos[h:] + x[:h] sin[h:]   (h = dim/2)
// which is x cos + rotate_half(x) sin; backward (x holds dy, out dx), its transpose:
//   dx[:h] = dy[:h] cos[:h] + dy[h:] sin[h:],  dx[h:] = dy[h:] cos[h:] - dy[:h] sin[:h].
// Every element computed in fp32 and rounded once.
struct RopeParams {
  const void* x = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t dim = 0;  // even
  RopeDType dtype = RopeDType::kBFloat16;
  bool backward = false;
};

// Queues the kernel on `stream` (a cudaStream_t); returns a cudaError_t.
int LaunchRope(const RopeParams& p, void* stream);

}  // namespace dflash::kernels

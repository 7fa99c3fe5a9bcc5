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

// A target's per-head q / k RMSNorm and RoPE in one pass (inference only): x [rows, heads, dim]
// with rows `row_stride` elements apart, heads dim apart (the q or k columns of the fused qkv
// product, read in place); weight [dim]; cos, sin [rows, dim] contiguous; out [rows, heads, dim]
// contiguous; all of `dtype`; dim 64, 128 or 256. Per (row, head), in fp32:
//   n = round(x * rsqrt(mean(x^2) + eps) * weight)       (at::rms_norm's arithmetic, rounded once)
//   out = round(n cos + rotate_half(n) sin)              (LaunchRope's forward)
// so the result is the composition's, the sum of squares in another order aside.
struct NormRopeParams {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  int64_t row_stride = 0;  // elements between consecutive rows of x
  float eps = 1e-6f;
  RopeDType dtype = RopeDType::kBFloat16;
};

int LaunchNormRope(const NormRopeParams& p, void* stream);

}  // namespace dflash::kernels

// SwiGLU's elementwise part in one pass per direction (common/kernels/swiglu/swiglu.h): the plain
// struct shared by the launcher (swiglu_launch.cu) and the LibTorch binding (swiglu.cc).
#pragma once

#include <cstdint>

namespace dflash::kernels {

enum class SwiGluDType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// g, u, a, dg, du: `n` contiguous elements (or rows: `cols` below) of `dtype`, every element
// computed in fp32 and rounded once (s = silu(g) = g / (1 + exp(-g)), sigma = sigmoid(g)).
//   forward:  out = s * u                                         (reads g, u; writes out)
//   backward: du = da * s,  dg = da * u * sigma * (1 + g (1 - sigma))
//             (reads da, g, u; writes dg and du; dg may alias da)
struct SwiGluParams {
  const void* g = nullptr;
  const void* u = nullptr;
  const void* da = nullptr;  // backward only
  void* out = nullptr;       // forward: s * u; backward: dg
  void* du = nullptr;        // backward only
  int64_t n = 0;
  SwiGluDType dtype = SwiGluDType::kBFloat16;
  bool backward = false;
  // Rows (forward only; 0: off): out is `n / cols` rows of `cols` contiguous elements, and row r's
  // g and u elements start at g + r * ld and u + r * ld (e.g. the two column halves of a fused
  // [N, 2I] gate_up product: cols = I, ld = 2I, u = g + I).
  int64_t cols = 0;
  int64_t ld = 0;
};

// Queues the kernel on `stream` (a cudaStream_t); returns a cudaError_t.
int LaunchSwiGlu(const SwiGluParams& p, void* stream);

}  // namespace dflash::kernels

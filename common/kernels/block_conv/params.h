// DFlash2's grouped dynamic causal convolution over each block's slots (docs/method.md §2.2;
// common/kernels/block_conv/block_conv.h): the plain struct shared by the launcher
// (block_conv_launch.cu) and the LibTorch binding (block_conv.cc).
#pragma once

#include <cstdint>

namespace dflash::kernels {

enum class BlockConvDType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Rows r = 0..rows-1 are blocks of `block` slots (slot(r) = r % block); channels c = 0..h-1 are
// groups of `group` channels (g(c) = c / group, G = h / group groups). With K = `kernel` taps:
//   out[r, c]      = sum_{t < K, slot(r) >= t} x[r - t, c] * (base[t, c] + delta[r, t, g(c)])
// and, given dy = d loss / d out:
//   dx[r, c]       = sum_{t < K, slot(r) + t < block} dy[r + t, c] * (base[t, c] + delta[r + t, t,
//   g(c)]) ddelta[r, t, g] = [slot(r) >= t] sum_{c in g} dy[r, c] * x[r - t, c] dbase_partial[i, t,
//   c] = sum_{r in rows tile i, slot(r) >= t} dy[r, c] * x[r - t, c]
// (tiles of `tile_rows` rows; the caller sums the partials over i). x, out, dy, dx: [rows, h];
// delta, ddelta: [rows, K, G], all contiguous in `dtype`; base [K, h] and dbase_partial
// [ceil(rows / tile_rows), K, h] contiguous fp32. Arithmetic in fp32, each output rounded once.
struct BlockConvParams {
  const void* x = nullptr;
  const void* delta = nullptr;
  const float* base = nullptr;
  void* out = nullptr;       // forward
  const void* dy = nullptr;  // backward
  void* dx = nullptr;
  void* ddelta = nullptr;
  float* dbase_partial = nullptr;
  int64_t rows = 0, h = 0, kernel = 0, block = 0, group = 0, tile_rows = 64;
  BlockConvDType dtype = BlockConvDType::kBFloat16;
};

// Queue the forward (out) or the backward (dx, ddelta, dbase_partial) on `stream` (a
// cudaStream_t); return a cudaError_t (cudaErrorInvalidValue for inconsistent sizes).
int LaunchBlockConvForward(const BlockConvParams& p, void* stream);
int LaunchBlockConvBackward(const BlockConvParams& p, void* stream);

}  // namespace dflash::kernels

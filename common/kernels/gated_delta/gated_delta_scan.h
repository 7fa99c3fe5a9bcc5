// The chunked gated delta rule (common/nn/gated_delta.h) on CUDA as two kernels: the intra-chunk
// phase (chunk_launch.cu: per chunk and head, the rows gathered from the packed tensors and
// L2-normalized, the UT system solved in registers) and the chunk-to-chunk recurrence
// (scan_launch.cu: one launch instead of a few small batched GEMMs per step, writing the packed
// output). This is the LibTorch side. The reference is the ATen path of nn::GatedDeltaRuleChunked
// (the GPU test compares both with nn::GatedDeltaRuleReference, token by token).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dflash::kernels {

// Whether the kernels run this shape: key head dim 64, 128 or 256, value head dim a multiple of
// 32, 64-row chunks, at most 65535 documents, fp32, bf16 or fp16.
bool SupportsGatedDeltaRule(int64_t dk, int64_t dv, int64_t chunk, int64_t documents,
                            c10::ScalarType dtype);

// The chunk layout of params.h: rows[c * 64 + r] is the packed row of row r of chunk c (-1:
// padding); step j runs chunks offsets[j] .. offsets[j] + active[j] - 1 (documents sorted by their
// number of chunks, most first).
struct GatedDeltaLayout {
  std::vector<int32_t> rows;
  std::vector<int64_t> offsets, active;
  int64_t documents = 0;
};

// q, k [T, Hv, DK] (before the L2 norm), v [T, Hv, DV], beta [T, Hv] in one dtype, g [T, Hv] fp32,
// all on one CUDA device. Returns [T, Hv, DV] in v's dtype. TORCH_CHECKs shapes, dtypes, devices
// and the layout.
at::Tensor GatedDeltaRuleCuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& g, const at::Tensor& beta,
                              const GatedDeltaLayout& layout);

}  // namespace dflash::kernels

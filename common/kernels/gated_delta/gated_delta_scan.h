// The inter-chunk recurrence of the chunked gated delta rule (common/nn/gated_delta.h) on CUDA in
// one launch (scan_launch.cu), instead of a few small batched GEMMs per step: the LibTorch side.
// The reference is the step loop of nn::GatedDeltaRuleChunked (the GPU test compares both with
// nn::GatedDeltaRuleReference).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dflash::kernels {

// Whether the kernel runs this shape: key head dim 64, 128 or 256, value head dim a multiple of
// 32, 64-row chunks, at most 65535 documents.
bool SupportsGatedDeltaScan(int64_t dk, int64_t dv, int64_t chunk, int64_t documents);

// w, q, k [N, Hv, 64, DK]; u [N, Hv, 64, DV]; a [N, Hv, 64, 64]; decay [N, Hv]: fp32 on one CUDA
// device (made contiguous here). offsets[j] / active[j]: the first chunk and the number of
// documents of step j (documents sorted by chunk count, most first). Returns out [N, Hv, 64, DV].
// TORCH_CHECKs shapes, dtypes and devices.
at::Tensor GatedDeltaScan(const at::Tensor& w, const at::Tensor& u, const at::Tensor& q,
                          const at::Tensor& a, const at::Tensor& k, const at::Tensor& decay,
                          const std::vector<int64_t>& offsets, const std::vector<int64_t>& active,
                          int64_t documents);

}  // namespace dflash::kernels

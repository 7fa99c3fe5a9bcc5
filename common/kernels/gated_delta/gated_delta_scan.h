// The chunked gated delta rule (common/nn/gated_delta.h) on CUDA as two kernels: the intra-chunk
// phase (chunk_launch.cu: per chunk and head, the UT system solved in registers) and the
// chunk-to-chunk recurrence (scan_launch.cu: one launch instead of a few small batched GEMMs per
// step). This is the LibTorch side. The reference is the ATen path of nn::GatedDeltaRuleChunked
// (the GPU test compares both with nn::GatedDeltaRuleReference, token by token).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dflash::kernels {

// The intra-chunk phase (chunk_launch.cu): q, k [N, Hv, 64, DK] (L2-normalized; q also scaled by
// DK^-0.5), v [N, Hv, 64, DV], beta and g [N, Hv, 64], fp32 contiguous on one CUDA device, to the
// inputs of GatedDeltaScan: w (k_cumdecay), u (new values), q (decayed queries), a (the chunk's
// attention), k (keys decayed to the chunk's end), decay [N, Hv]. TORCH_CHECKs shapes.
struct GatedDeltaChunkOutputs {
  at::Tensor w, u, q, a, k, decay;
};
GatedDeltaChunkOutputs GatedDeltaChunk(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& beta,
                                       const at::Tensor& g);

// Whether the kernels run this shape: key head dim 64, 128 or 256, value head dim a multiple of
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

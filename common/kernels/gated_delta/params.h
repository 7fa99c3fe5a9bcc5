// The chunked gated delta rule (common/nn/gated_delta.h) on CUDA: the plain structs shared by the
// launchers (chunk_launch.cu, scan_launch.cu) and the LibTorch binding (gated_delta_scan.cc).
//
// Layout: 64-row chunks never hold two documents; chunk j of (sorted) document d is chunk
// steps[2j] + d, for the documents d < steps[2j + 1] that have a chunk at step j. rows[c * 64 + r]
// is the packed row (token) of row r of chunk c, or -1 for padding. The packed tensors are
// [T, Hv, D] in the model's dtype (fp32, bf16 or fp16); the intermediates between the two kernels
// are fp32 [chunks, Hv, 64, D].
#pragma once

#include <cstdint>

namespace dflash::kernels {

constexpr int kScanChunk = 64;    // rows per chunk
constexpr int kScanColumns = 32;  // value columns per CTA of the recurrence
constexpr int kScanThreads = 256;

enum class ScanDType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// The intra-chunk phase: one CTA per (chunk, head) reads its rows of the packed q, k, v, beta, g,
// L2-normalizes q and k (q also scaled by DK^-0.5), and writes the recurrence's inputs: w, u, the
// decayed queries and keys, the chunk's attention a and its decay.
struct GatedDeltaChunkParams {
  const void* q;        // [T, Hv, DK], dtype
  const void* k;        // [T, Hv, DK], dtype
  const void* v;        // [T, Hv, DV], dtype
  const void* beta;     // [T, Hv], dtype
  const float* g;       // [T, Hv]: log decay (<= 0)
  const int32_t* rows;  // [chunks * 64]
  float* w;             // [chunks, Hv, C, DK]: decayed keys through the UT transform
  float* u;             // [chunks, Hv, C, DV]: writes through the UT transform
  float* q_out;         // [chunks, Hv, C, DK]: decayed queries
  float* a;             // [chunks, Hv, C, C]: the chunk's own attention (lower triangle)
  float* k_out;         // [chunks, Hv, C, DK]: keys decayed to the chunk's end
  float* decay;         // [chunks, Hv]: the whole chunk's decay
  ScanDType dtype = ScanDType::kFloat32;
  int64_t chunks = 0, heads = 0, dk = 0, dv = 0;
};

// The chunk-to-chunk recurrence: one CTA per (32 value columns, head, document) carries its slice
// of the state through the document's chunks and writes the output rows of the packed [T, Hv, DV]
// tensor (padding rows are not written).
struct GatedDeltaScanParams {
  const float* w;  // GatedDeltaChunkParams' outputs
  const float* u;
  const float* q;
  const float* a;
  const float* k;
  const float* decay;
  const int32_t* steps;  // [2 * num_steps]: first chunk and active documents of each step
  const int32_t* rows;   // [chunks * 64]
  void* out;             // [T, Hv, DV], dtype
  ScanDType dtype = ScanDType::kFloat32;
  int64_t num_steps = 0;
  int64_t documents = 0;
  int64_t heads = 0;  // Hv
  int64_t dk = 0, dv = 0;
};

// Launch on `stream` (a cudaStream_t); return the cudaError_t of the launch.
int LaunchGatedDeltaChunk(const GatedDeltaChunkParams& p, void* stream);
int LaunchGatedDeltaScan(const GatedDeltaScanParams& p, void* stream);

}  // namespace dflash::kernels

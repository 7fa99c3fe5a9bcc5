// The inter-chunk recurrence of the chunked gated delta rule (common/nn/gated_delta.h) as one
// CUDA launch: the plain struct shared by the launcher (scan_launch.cu) and the LibTorch binding
// (gated_delta_scan.cc). Every tensor is fp32, contiguous, in the step-major chunk layout of
// GatedDeltaRuleChunked: chunk j of (sorted) document d is chunk steps[2j] + d, for the documents
// d < steps[2j + 1] that have a chunk at step j.
#pragma once

#include <cstdint>

namespace dflash::kernels {

constexpr int kScanChunk = 64;    // rows per chunk
constexpr int kScanColumns = 32;  // value columns per CTA
constexpr int kScanThreads = 256;

struct GatedDeltaScanParams {
  const float* w;        // [chunks, Hv, C, DK]: the chunk's decayed keys through the UT transform
  const float* u;        // [chunks, Hv, C, DV]: the chunk's writes through the UT transform
  const float* q;        // [chunks, Hv, C, DK]: decayed queries
  const float* a;        // [chunks, Hv, C, C]: the chunk's own attention (lower triangle)
  const float* k;        // [chunks, Hv, C, DK]: keys decayed to the chunk's end
  const float* decay;    // [chunks, Hv]: the whole chunk's decay
  const int32_t* steps;  // [2 * num_steps]: first chunk and active documents of each step
  float* out;            // [chunks, Hv, C, DV]
  int64_t num_steps = 0;
  int64_t documents = 0;
  int64_t heads = 0;  // Hv
  int64_t dk = 0, dv = 0;
};

// Launches on `stream` (a cudaStream_t); returns the cudaError_t of the launch.
int LaunchGatedDeltaScan(const GatedDeltaScanParams& p, void* stream);

// The intra-chunk phase (chunk_launch.cu): one CTA per (chunk, head) turns the chunk's
// normalized queries and keys, values, write strengths and log decays into the scan's inputs
// above (w, u, q, a, k, decay), the UT system solved by forward substitution in registers.
struct GatedDeltaChunkParams {
  const float* q;     // [chunks, Hv, C, DK]: L2-normalized, scaled by DK^-0.5
  const float* k;     // [chunks, Hv, C, DK]: L2-normalized
  const float* v;     // [chunks, Hv, C, DV]
  const float* beta;  // [chunks, Hv, C]
  const float* g;     // [chunks, Hv, C]: log decay per row (<= 0; 0 on padding rows)
  float* w;           // outputs, as GatedDeltaScanParams
  float* u;
  float* q_out;
  float* a;
  float* k_out;
  float* decay;
  int64_t chunks = 0, heads = 0, dk = 0, dv = 0;
};

int LaunchGatedDeltaChunk(const GatedDeltaChunkParams& p, void* stream);

}  // namespace dflash::kernels

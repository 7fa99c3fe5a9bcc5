// Parameters of the fused cross-entropy row kernel (fused_ce_kernel.cuh): plain pointers and sizes,
// no framework types, so the CUDA translation unit stays free of LibTorch headers.
#pragma once

#include <cstdint>

namespace dflash::kernels {

enum class CeDType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

struct FusedCeParams {
  // [rows, vocab] logits of one chunk, row stride `ld` elements; overwritten in place with
  // d(sum_i w_i * CE_i) / d logits = w_i * (softmax(row i) - onehot(label_i)).
  void* logits = nullptr;
  CeDType dtype = CeDType::kBFloat16;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t ld = 0;
  const int64_t* labels = nullptr;  // [rows], in [0, vocab)
  const float* weights = nullptr;   // [rows]
  float* loss = nullptr;            // [rows] out: logsumexp(row) - row[label], fp32
  bool* correct = nullptr;          // [rows] out: first argmax of the row == label
};

// Launches one CTA per row on `stream` (a cudaStream_t). Returns the CUDA error of the launch.
int LaunchFusedCeRows(const FusedCeParams& params, void* stream);

}  // namespace dflash::kernels

// Causal self-attention over a packed batch of documents (varlen): rows of different documents
// never attend to each other, and there is no padding. The model code calls VarlenCausalAttention
// and never sees which kernel runs:
//   CUDA, fp16/bf16, head_dim % 8 == 0 and <= 256: LibTorch's flash-attention varlen kernel
//     (at::_flash_attention_forward with cu_seqlens), GQA native;
//   other CUDA inputs: at::scaled_dot_product_attention per document;
//   CPU: VarlenCausalAttentionReference, an explicit softmax(q k^T) v per document.
// Functions here throw c10::Error on misuse (TORCH_CHECK); the model's public methods convert.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::nn {

// Document boundaries of a packed batch, on the compute device for kernels and on the host for
// per-document loops, so that a forward pass reads cu_seqlens from the device once, not per layer.
struct VarlenDocs {
  at::Tensor cu_seqlens;         // [b+1] int32 on the compute device
  std::vector<int64_t> offsets;  // [b+1] host copy: document d is rows offsets[d]..offsets[d+1]-1
  int64_t max_len = 0;           // longest document

  // cu_seqlens: [b+1] int32 on any device, nondecreasing, starting at 0.
  static VarlenDocs FromCuSeqlens(const at::Tensor& cu_seqlens, c10::Device device);
};

// Which kernel VarlenCausalAttention runs for inputs on `device` in `dtype` with `head_dim`, for
// the run's start event: "flash varlen" (with "; documents of N+ tokens: cuDNN" where long
// documents take cuDNN), "SDPA per document (<why>)" or "reference (the CPU)".
std::string VarlenAttentionKernel(c10::Device device, c10::ScalarType dtype, int64_t head_dim);

// Documents at least this long run through cuDNN's fused attention, one call each, where the
// flash varlen kernel would run them (bf16 / fp16, head_dim 64 or 128): 4096 by default,
// DFLASH_CUDNN_ATTN_MIN_TOKENS in the environment (0: never). On one H200 the two kernels took
// 1.761 (flash varlen) and 0.942 ms (cuDNN) per Qwen3-8B layer on one 8192-token document
// (docs/benchmarks.md, "Target model forward").
int64_t CudnnAttentionMinTokens();

// q [T, Hq, D], k and v [T, Hkv, D] with Hq % Hkv == 0 (query head h reads kv head h / (Hq/Hkv),
// as HF repeat_kv does); returns [T, Hq, D] in q's dtype. scale multiplies q k^T (usually D^-0.5).
// On CUDA in bf16 / fp16: flash-attention's varlen kernel over the documents, each run of
// consecutive documents shorter than `cudnn_min_tokens` in one call, and each longer one through
// cuDNN (0: flash for all; a cuDNN that refuses the call falls back to flash for the rest of the
// process, with a warning on stderr).
at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const VarlenDocs& docs, double scale, int64_t cudnn_min_tokens);
at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const VarlenDocs& docs, double scale);
at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, double scale);

// The reference on any device: per document, scores = q k^T * scale with a causal mask, softmax
// in fp32 (cast back to q's dtype as HF eager attention does), times v. Scratch memory is
// O(Hq * n^2) for the longest document n, independent of the number of documents.
at::Tensor VarlenCausalAttentionReference(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const VarlenDocs& docs,
                                          double scale);

// Attention of n new query rows of one sequence over its m = past + n cached keys (a KV cache):
// q [n, Hq, D], k and v [m, Hkv, D]; new row i (position past + i) sees keys 0..past + i. Returns
// [n, Hq, D] in q's dtype, softmax in fp32 as the reference. Scratch O(Hq * n * m): meant for
// decoding, where n is 1 or a speculative block.
at::Tensor CachedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale);

}  // namespace dflash::nn

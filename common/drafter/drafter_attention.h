// Attention of the DFlash drafter (method.md §3.3) behind one interface, so that the model code
// never sees which implementation runs: the CPU reference here, which materializes the scores of
// each anchor block densely, or a fused block-sparse GPU kernel (later) that never does.
//
// Layout. A packed batch has T context rows (the target features of every packed position) and n
// anchor blocks of B query slots each, Q = n*B block rows; block j is rows j*B..(j+1)*B-1 of the
// query stream. Keys and values are [context rows 0..T-1 ; block rows 0..Q-1], T + Q rows.
//
// Mask. Query slot (j, k) sees
//   - context row c iff doc[c] == doc[a_j] and c < a_j (strictly before the anchor: at inference
//     the anchor's own feature does not exist yet);
//   - block row (j', k') iff j' == j (its own block, both directions; never another block) and
//     k' < block_lengths[j] when the mask has block lengths.
// A sliding-attention layer (BlockMask::causal, BlockMask::window; method.md §2.1) narrows both:
// slot k sees its block's rows k' <= k only, and with a window W only the rows within W
// positions of its own: context rows c > a_j + k - W and block rows k' > k - W.
// A padding block (anchor -1) sees nothing; its output rows are zeros, never NaN, and so are the
// gradients that flow through them.
//
// Functions here throw c10::Error on misuse (TORCH_CHECK); DrafterModel converts to Status.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dflash::drafter {

// The fused kernel's work lists for one mask (built on first use, shared by the copies of one
// BlockMask, so every layer of a step reuses them). Opaque outside drafter_attention.cc.
struct KernelPlanCache;

// Which keys each block sees, on the compute device.
struct BlockMask {
  int64_t block_size = 0;  // B
  // [n] int64: a_j, the packed row of block j's anchor, ascending; -1 marks a padding block.
  at::Tensor anchors;
  // [T] int64: document of each context row (0, 1, ... in packing order).
  at::Tensor doc_ids;
  // [n] int64: first row of the anchor's document (0 for padding blocks). Documents are contiguous,
  // so the visible context of block j is exactly rows ctx_begin[j] .. anchors[j]-1: the range form
  // a fused kernel wants. Equal to the doc_ids form by construction (BuildBlockMask).
  at::Tensor ctx_begin;
  std::shared_ptr<KernelPlanCache> kernel_plan;  // set by BuildBlockMask
  // [n] int64 in [1, B], or undefined (every block B slots): block j's slots k >= block_lengths[j]
  // are invisible as keys, so slots below it compute what a block of that many slots would (the
  // shorter last block of speculative decoding near the token limit). Inference only: the fused
  // kernel does not take it (the reference runs).
  at::Tensor block_lengths;
  // A sliding-attention layer's view (the copy DrafterModel makes for that layer): slot k sees its
  // block's slots k' <= k only (causal), and with window > 0 only rows less than `window`
  // positions before its own. The fused kernel takes it when window is 0 or at least B, skipping
  // the key tiles outside every window of a block (its cost falls with the window).
  bool causal = false;
  int64_t window = 0;
};

// A drafter's attention geometry, for AttentionKernelReport.
struct AttentionGeometry {
  c10::Device device;
  c10::ScalarType dtype;                // the compute dtype
  int64_t head_dim, group, block_size;  // group: query heads per kv head
};

// Which attention each layer runs, for the run's start event: "attention: fused kernels in every
// layer", or where and why the reference runs (the CPU, the compute dtype, the head geometry, a
// sliding window below the block size; `fused` false: an attention the caller set). windows: per
// layer, 0 for none.
std::string AttentionKernelReport(const AttentionGeometry& g, const std::vector<int64_t>& windows,
                                  bool fused);

// Builds the mask metadata. anchors [n] int64 (ascending among entries >= 0, -1 padding) and
// doc_ids [T] int64 on the same device; checks shapes only (DrafterModel validates values).
BlockMask BuildBlockMask(const at::Tensor& anchors, const at::Tensor& doc_ids, int64_t block_size,
                         const at::Tensor& block_lengths = at::Tensor());

class DrafterAttention {
 public:
  virtual ~DrafterAttention() = default;
  // q [Q, Hq, D] (block rows, after q_norm and RoPE); k, v [T + Q, Hkv, D] (context rows then block
  // rows, after k_norm and RoPE for k); Hq % Hkv == 0 and query head h reads kv head h / (Hq/Hkv).
  // scale multiplies q k^T (D^-0.5). Returns [Q, Hq, D] in q's dtype, differentiable in q, k, v.
  virtual at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const BlockMask& mask, double scale) const = 0;
};

// The reference on any device: for a chunk of blocks at a time, the scores of each block against
// the context rows it can see (its document's rows before its anchor, within a sliding window's
// reach; gathered, the shorter blocks' tails masked) and its own B block rows ([chunk, Hq, B,
// longest + B], other blocks are never visible), the mask above applied, softmax in fp32 cast
// back to q's dtype (as HF eager attention does), times v. Scratch is bounded by
// max_score_elements per chunk (at least one block per chunk). A batch of many documents costs
// what its blocks see, not every block against the batch's whole context.
class ReferenceDrafterAttention : public DrafterAttention {
 public:
  explicit ReferenceDrafterAttention(int64_t max_score_elements = int64_t{1} << 26)
      : max_score_elements_(max_score_elements) {}
  at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const BlockMask& mask, double scale) const override;

 private:
  int64_t max_score_elements_;
};

// The fused block-sparse kernel of common/kernels/dflash_attn for the calls it supports (CUDA,
// bf16, head_dim 64 or 128 (256 on compute capability 9.0), 1 to 64 query heads per kv head,
// block_size <= 64), the reference for every other call (CPU, fp32, ...). Online softmax: no score
// matrix exists, forward or backward. In builds without CUDA it is the reference.
class FusedDrafterAttention : public DrafterAttention {
 public:
  at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const BlockMask& mask, double scale) const override;
  // Whether a layer of this geometry runs the fused kernel (Supports from the shapes alone).
  static bool Qualifies(c10::Device device, c10::ScalarType dtype, int64_t head_dim, int64_t group,
                        int64_t block_size, int64_t window);
  // True when this call runs the fused kernel.
  static bool Supports(const at::Tensor& q, const at::Tensor& k, const BlockMask& mask);

 private:
  ReferenceDrafterAttention reference_;
};

}  // namespace dflash::drafter

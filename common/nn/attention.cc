#include "common/nn/attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

namespace dflash::nn {
namespace {

void CheckShapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const VarlenDocs& docs) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "attention: q, k, v must be [T, H, D]");
  TORCH_CHECK(k.sizes() == v.sizes(), "attention: k ", k.sizes(), " and v ", v.sizes(), " differ");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2), "attention: q ", q.sizes(),
              " does not match k ", k.sizes());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "attention: ", q.size(1),
              " query heads are not a multiple of ", k.size(1), " kv heads");
  TORCH_CHECK(
      !docs.offsets.empty() && docs.offsets.front() == 0 && docs.offsets.back() == q.size(0),
      "attention: cu_seqlens must run from 0 to T = ", q.size(0));
}

bool FlashEligible(c10::Device device, c10::ScalarType dtype, int64_t d) {
  return device.is_cuda() && (dtype == at::kHalf || dtype == at::kBFloat16) && d % 8 == 0 &&
         d <= 256;
}

bool FlashEligible(const at::Tensor& q) {
  return FlashEligible(q.device(), q.scalar_type(), q.size(2));
}

// CUDA fallback for dtypes or head sizes the flash kernel does not take: one fused SDPA call per
// document ([1, H, n, D] views), written into its rows of `out`.
at::Tensor SdpaPerDocument(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const VarlenDocs& docs, double scale) {
  at::Tensor out = at::empty_like(q);
  for (size_t d = 0; d + 1 < docs.offsets.size(); ++d) {
    const int64_t start = docs.offsets[d];
    const int64_t n = docs.offsets[d + 1] - start;
    if (n == 0) continue;
    auto heads_first = [&](const at::Tensor& x) {
      return x.narrow(0, start, n).transpose(0, 1).unsqueeze(0);  // [1, H, n, D]
    };
    at::Tensor o = at::scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v),
                                                    /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                    /*is_causal=*/true, scale, /*enable_gqa=*/true);
    out.narrow(0, start, n).copy_(o.squeeze(0).transpose(0, 1));
  }
  return out;
}

// Whether cuDNN may take a long document of this dtype and head dim.
bool CudnnEligible(c10::ScalarType dtype, int64_t d) {
  return (dtype == at::kHalf || dtype == at::kBFloat16) && (d == 64 || d == 128);
}

std::atomic<bool> cudnn_refused{false};  // a cuDNN call failed once: flash from then on

// Flash-attention's varlen forward over documents first..first+count-1 (rows start..start+n-1).
at::Tensor FlashRun(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const VarlenDocs& docs, size_t first, size_t count, double scale) {
  const int64_t start = docs.offsets[first], n = docs.offsets[first + count] - start;
  int64_t max_len = 0;
  for (size_t d = first; d < first + count; ++d) {
    max_len = std::max(max_len, docs.offsets[d + 1] - docs.offsets[d]);
  }
  const bool whole = first == 0 && count + 1 == docs.offsets.size();
  const at::Tensor cu = whole ? docs.cu_seqlens
                              : docs.cu_seqlens.narrow(0, static_cast<int64_t>(first),
                                                       static_cast<int64_t>(count) + 1) -
                                    static_cast<int32_t>(start);
  // Returns (out [n, Hq, D], logsumexp, philox seed, philox offset, debug mask).
  auto result = at::_flash_attention_forward(
      q.narrow(0, start, n).contiguous(), k.narrow(0, start, n).contiguous(),
      v.narrow(0, start, n).contiguous(), cu, cu, max_len, max_len, /*dropout_p=*/0.0,
      /*is_causal=*/true, /*return_debug_mask=*/false, scale);
  return std::get<0>(result);
}

// cuDNN's fused attention over one document (rows start..start+n-1), kv heads repeated to the
// query heads (the op takes no GQA); an empty tensor when cuDNN refuses the call.
at::Tensor CudnnDocument(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         int64_t start, int64_t n, double scale) {
  const int64_t group = q.size(1) / k.size(1);
  auto heads_first = [&](const at::Tensor& x) {  // [1, H, n, D] over [n, H, D] rows
    return x.narrow(0, start, n).unsqueeze(0).transpose(1, 2);
  };
  auto repeated = [&](const at::Tensor& x) {
    return group == 1 ? x.narrow(0, start, n)
                      : at::repeat_interleave(x.narrow(0, start, n), group, /*dim=*/1);
  };
  try {
    const at::Tensor kr = repeated(k), vr = repeated(v);
    auto result = at::_scaled_dot_product_cudnn_attention(
        heads_first(q), kr.unsqueeze(0).transpose(1, 2), vr.unsqueeze(0).transpose(1, 2),
        /*attn_bias=*/std::nullopt, /*compute_log_sumexp=*/false, /*dropout_p=*/0.0,
        /*is_causal=*/true, /*return_debug_mask=*/false, scale);
    return std::get<0>(result).squeeze(0).transpose(0, 1);  // [n, Hq, D]
  } catch (const c10::OutOfMemoryError&) {
    throw;  // not a refusal: the caller's out-of-memory recovery handles it
  } catch (const c10::Error& e) {
    if (!cudnn_refused.exchange(true)) {
      std::fprintf(stderr,
                   "dflash: cuDNN attention refused a %lld-token document (%s); long documents "
                   "run through flash varlen from now on\n",
                   static_cast<long long>(n), e.what_without_backtrace());
    }
    return at::Tensor();
  }
}

}  // namespace

int64_t CudnnAttentionMinTokens() {
  static const int64_t min_tokens = [] {
    const char* v = std::getenv("DFLASH_CUDNN_ATTN_MIN_TOKENS");
    if (v == nullptr || *v == '\0') return int64_t{4096};
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    return (end != nullptr && *end == '\0' && n >= 0) ? static_cast<int64_t>(n) : int64_t{4096};
  }();
  return min_tokens;
}

VarlenDocs VarlenDocs::FromCuSeqlens(const at::Tensor& cu_seqlens, c10::Device device) {
  TORCH_CHECK(
      cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 1 && cu_seqlens.scalar_type() == at::kInt,
      "cu_seqlens must be a non-empty 1-D int32 tensor");
  VarlenDocs docs;
  at::Tensor host = cu_seqlens.to(at::kCPU).contiguous();
  const int32_t* p = host.data_ptr<int32_t>();
  docs.offsets.assign(p, p + host.numel());
  TORCH_CHECK(docs.offsets.front() == 0, "cu_seqlens must start at 0");
  for (size_t d = 0; d + 1 < docs.offsets.size(); ++d) {
    const int64_t n = docs.offsets[d + 1] - docs.offsets[d];
    TORCH_CHECK(n >= 0, "cu_seqlens must be nondecreasing (at index ", d + 1, ")");
    docs.max_len = std::max(docs.max_len, n);
  }
  docs.cu_seqlens = cu_seqlens.to(device);
  return docs;
}

at::Tensor VarlenCausalAttentionReference(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const VarlenDocs& docs,
                                          double scale) {
  CheckShapes(q, k, v, docs);
  const int64_t hq = q.size(1), hkv = k.size(1), dim = q.size(2), group = hq / hkv;
  at::Tensor out = at::empty_like(q);
  for (size_t d = 0; d + 1 < docs.offsets.size(); ++d) {
    const int64_t start = docs.offsets[d];
    const int64_t n = docs.offsets[d + 1] - start;
    if (n == 0) continue;
    // Query heads grouped by the kv head they read: [Hkv, G, n, D]; k, v broadcast: [Hkv, 1, n, D].
    at::Tensor qd = q.narrow(0, start, n).permute({1, 0, 2}).reshape({hkv, group, n, dim});
    at::Tensor kd = k.narrow(0, start, n).permute({1, 0, 2}).unsqueeze(1);
    at::Tensor vd = v.narrow(0, start, n).permute({1, 0, 2}).unsqueeze(1);
    at::Tensor scores = at::matmul(qd, kd.transpose(-1, -2)) * scale;  // [Hkv, G, n, n]
    at::Tensor future = at::ones({n, n}, q.options().dtype(at::kBool)).triu(1);
    scores.masked_fill_(future, -std::numeric_limits<double>::infinity());
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    at::Tensor o = at::matmul(probs, vd);  // [Hkv, G, n, D]
    out.narrow(0, start, n).copy_(o.reshape({hq, n, dim}).permute({1, 0, 2}));
  }
  return out;
}

at::Tensor CachedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes(),
              "cached attention: q [n, Hq, D], k and v [m, Hkv, D]");
  const int64_t n = q.size(0), m = k.size(0), hq = q.size(1), hkv = k.size(1), dim = q.size(2);
  TORCH_CHECK(m >= n && hkv > 0 && hq % hkv == 0 && k.size(2) == dim, "cached attention: q ",
              q.sizes(), " does not fit k ", k.sizes());
  const int64_t group = hq / hkv, past = m - n;
  at::Tensor qd = q.permute({1, 0, 2}).reshape({hkv, group, n, dim});
  at::Tensor kd = k.permute({1, 0, 2}).unsqueeze(1);  // [Hkv, 1, m, D]
  at::Tensor vd = v.permute({1, 0, 2}).unsqueeze(1);
  at::Tensor scores = at::matmul(qd, kd.transpose(-1, -2)) * scale;  // [Hkv, G, n, m]
  if (n > 1) {  // key j is in the future of row i when j > past + i
    at::Tensor future = at::ones({n, m}, q.options().dtype(at::kBool)).triu(past + 1);
    scores.masked_fill_(future, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probs, vd).reshape({hq, n, dim}).permute({1, 0, 2});  // [n, Hq, D]
}

std::string VarlenAttentionKernel(c10::Device device, c10::ScalarType dtype, int64_t head_dim) {
  if (!device.is_cuda()) return "reference (the CPU)";
  if (FlashEligible(device, dtype, head_dim)) {
    const int64_t min_tokens = CudnnAttentionMinTokens();
    if (min_tokens > 0 && CudnnEligible(dtype, head_dim)) {
      return "flash varlen; documents of " + std::to_string(min_tokens) + "+ tokens: cuDNN";
    }
    return "flash varlen";
  }
  return std::string("SDPA per document (") + c10::toString(dtype) + ", head_dim " +
         std::to_string(head_dim) + ")";
}

at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const VarlenDocs& docs, double scale) {
  return VarlenCausalAttention(q, k, v, docs, scale, CudnnAttentionMinTokens());
}

at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const VarlenDocs& docs, double scale, int64_t cudnn_min_tokens) {
  if (!q.is_cuda()) return VarlenCausalAttentionReference(q, k, v, docs, scale);
  CheckShapes(q, k, v, docs);
  if (!FlashEligible(q)) return SdpaPerDocument(q, k, v, docs, scale);
  TORCH_CHECK(docs.cu_seqlens.device() == q.device(), "attention: cu_seqlens on ",
              docs.cu_seqlens.device(), ", q on ", q.device());
  const size_t num_docs = docs.offsets.size() - 1;
  const bool cudnn = cudnn_min_tokens > 0 && docs.max_len >= cudnn_min_tokens &&
                     CudnnEligible(q.scalar_type(), q.size(2)) && !cudnn_refused.load();
  if (!cudnn) return FlashRun(q, k, v, docs, 0, num_docs, scale);
  // Each long document through cuDNN, each run of shorter ones through one flash call.
  at::Tensor out = at::empty_like(q);
  size_t run = 0;  // first document of the current run of short ones
  auto flush = [&](size_t end) {
    if (end > run && docs.offsets[end] > docs.offsets[run]) {
      out.narrow(0, docs.offsets[run], docs.offsets[end] - docs.offsets[run])
          .copy_(FlashRun(q, k, v, docs, run, end - run, scale));
    }
  };
  for (size_t d = 0; d < num_docs; ++d) {
    const int64_t start = docs.offsets[d], n = docs.offsets[d + 1] - start;
    if (n < cudnn_min_tokens) continue;
    flush(d);
    run = d + 1;
    at::Tensor o = cudnn_refused.load() ? at::Tensor() : CudnnDocument(q, k, v, start, n, scale);
    out.narrow(0, start, n).copy_(o.defined() ? o : FlashRun(q, k, v, docs, d, 1, scale));
  }
  flush(num_docs);
  return out;
}

at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, double scale) {
  return VarlenCausalAttention(q, k, v, VarlenDocs::FromCuSeqlens(cu_seqlens, q.device()), scale);
}

}  // namespace dflash::nn

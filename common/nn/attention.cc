#include "common/nn/attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

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

}  // namespace

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
  if (FlashEligible(device, dtype, head_dim)) return "flash varlen";
  return std::string("SDPA per document (") + c10::toString(dtype) + ", head_dim " +
         std::to_string(head_dim) + ")";
}

at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const VarlenDocs& docs, double scale) {
  if (!q.is_cuda()) return VarlenCausalAttentionReference(q, k, v, docs, scale);
  CheckShapes(q, k, v, docs);
  if (!FlashEligible(q)) return SdpaPerDocument(q, k, v, docs, scale);
  TORCH_CHECK(docs.cu_seqlens.device() == q.device(), "attention: cu_seqlens on ",
              docs.cu_seqlens.device(), ", q on ", q.device());
  // Returns (out [T, Hq, D], logsumexp, philox seed, philox offset, debug mask).
  auto result = at::_flash_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(),
                                             docs.cu_seqlens, docs.cu_seqlens, docs.max_len,
                                             docs.max_len, /*dropout_p=*/0.0, /*is_causal=*/true,
                                             /*return_debug_mask=*/false, scale);
  return std::get<0>(result);
}

at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, double scale) {
  return VarlenCausalAttention(q, k, v, VarlenDocs::FromCuSeqlens(cu_seqlens, q.device()), scale);
}

}  // namespace dflash::nn

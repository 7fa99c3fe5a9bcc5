#include "common/nn/gated_delta.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_solve_triangular.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/softplus.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "common/nn/layers.h"

#ifdef DFLASH_HAVE_GATED_DELTA_SCAN
#include "common/kernels/gated_delta/gated_delta_scan.h"
#endif

namespace dflash::nn {
namespace {

// Each row's index inside its document: [T] int64.
at::Tensor InDocumentIndex(const VarlenDocs& docs, int64_t t, c10::Device device) {
  std::vector<int64_t> idx(static_cast<size_t>(t));
  for (size_t d = 0; d + 1 < docs.offsets.size(); ++d) {
    for (int64_t r = docs.offsets[d]; r < docs.offsets[d + 1]; ++r) idx[r] = r - docs.offsets[d];
  }
  return at::tensor(idx, at::kLong).to(device);
}

// transformers' l2norm (the FLA library's): x * rsqrt(sum(x^2) + eps) over the last dimension.
at::Tensor L2Norm(const at::Tensor& x) {
  return x * ((x * x).sum(-1, /*keepdim=*/true) + 1e-6).rsqrt();
}

// transformers' Qwen3_5RMSNormGated: fp32 statistics, scaled by the weight in the input's dtype,
// then by silu(gate) in fp32. x, gate [..., dv], weight [dv].
at::Tensor GatedRmsNorm(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight,
                        double eps) {
  at::Tensor h = x.to(at::kFloat);
  h = h * (h.pow(2).mean(-1, /*keepdim=*/true) + eps).rsqrt();
  h = weight * h.to(x.scalar_type());
  return (h * at::silu(gate.to(at::kFloat))).to(x.scalar_type());
}

// The convolved rows [T, conv_dim] as q, k [T, Hv, dk] and v [T, Hv, dv]: key head i serves value
// heads i*r .. i*r + r-1 (transformers' repeat_interleave).
std::tuple<at::Tensor, at::Tensor, at::Tensor> SplitHeads(const at::Tensor& mixed,
                                                          const GatedDeltaDims& d) {
  const int64_t t = mixed.size(0), hk = d.num_k_heads, hv = d.num_v_heads;
  const int64_t dk = d.k_head_dim, kd = d.key_dim();
  at::Tensor q = mixed.narrow(1, 0, kd).reshape({t, hk, dk});
  at::Tensor k = mixed.narrow(1, kd, kd).reshape({t, hk, dk});
  const at::Tensor v = mixed.narrow(1, 2 * kd, d.value_dim()).reshape({t, hv, d.v_head_dim});
  if (hv != hk) {
    q = q.unsqueeze(2).expand({t, hk, hv / hk, dk}).reshape({t, hv, dk});
    k = k.unsqueeze(2).expand({t, hk, hv / hk, dk}).reshape({t, hv, dk});
  }
  return {q, k, v};
}

}  // namespace

GatedDeltaDims GatedDeltaDims::Of(const model::TransformerConfig& c) {
  GatedDeltaDims d;
  d.num_k_heads = c.linear_num_key_heads;
  d.num_v_heads = c.linear_num_value_heads;
  d.k_head_dim = c.linear_key_head_dim;
  d.v_head_dim = c.linear_value_head_dim;
  d.conv_kernel = c.linear_conv_kernel_dim;
  d.eps = c.rms_norm_eps;
  return d;
}

at::Tensor CausalConv1dVarlen(const at::Tensor& x, const at::Tensor& weight,
                              const VarlenDocs& docs) {
  const int64_t t = x.size(0), kernel = weight.size(1);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor wf = weight.to(at::kFloat);
  at::Tensor out = xf * wf.select(1, kernel - 1);  // the row itself
  if (t == 0) return out.to(x.scalar_type());
  at::Tensor idx = InDocumentIndex(docs, t, x.device());
  for (int64_t s = 1; s < kernel && s < t; ++s) {
    // Row r reads row r - s of its own document: rows within s of their document's start read
    // the zeros before it, as the per-document conv1d with kernel - 1 rows of left padding.
    at::Tensor shifted = at::zeros_like(xf);
    shifted.narrow(0, s, t - s).copy_(xf.narrow(0, 0, t - s));
    at::Tensor keep = (idx >= s).to(at::kFloat).unsqueeze(1);
    out = out + shifted * keep * wf.select(1, kernel - 1 - s);
  }
  return out.to(x.scalar_type());
}

namespace {

// Where each row of the packed batch goes in the chunked layout. Chunks never hold two documents;
// documents are sorted by their number of chunks (most first, stable) and chunk j of sorted
// document d is chunk offsets[j] + d: the chunks of step j of the scan are the contiguous chunks
// offsets[j] .. offsets[j] + active[j] - 1, and their documents' states are states 0 ..
// active[j] - 1. Rows past a document's end (up to chunk - 1 per document) are padding.
struct ChunkLayout {
  int64_t chunks = 0;             // in all
  std::vector<int64_t> offsets;   // per step: the first chunk of the step
  std::vector<int64_t> active;    // per step: how many documents have a chunk at this step
  std::vector<int64_t> row_slot;  // per row: chunk * chunk_size + row within the chunk
  int64_t documents = 0;          // with at least one row
  std::vector<int64_t> document;  // per state (sorted document): its index in docs
};

ChunkLayout MakeChunkLayout(const VarlenDocs& docs, int64_t t, int64_t chunk) {
  ChunkLayout l;
  std::vector<int64_t> order, count;  // non-empty documents; their chunk counts
  for (size_t d = 0; d + 1 < docs.offsets.size(); ++d) {
    const int64_t len = docs.offsets[d + 1] - docs.offsets[d];
    if (len == 0) continue;
    order.push_back(static_cast<int64_t>(d));
    count.push_back((len + chunk - 1) / chunk);
  }
  std::vector<size_t> rank(order.size());
  for (size_t i = 0; i < rank.size(); ++i) rank[i] = i;
  std::stable_sort(rank.begin(), rank.end(),
                   [&](size_t a, size_t b) { return count[a] > count[b]; });
  l.documents = static_cast<int64_t>(order.size());
  for (size_t i = 0; i < rank.size(); ++i) l.document.push_back(order[rank[i]]);
  const int64_t steps = rank.empty() ? 0 : count[rank.front()];
  for (int64_t j = 0; j < steps; ++j) {
    int64_t a = 0;
    while (a < l.documents && count[rank[a]] > j) ++a;
    l.offsets.push_back(l.chunks);
    l.active.push_back(a);
    l.chunks += a;
  }
  l.row_slot.resize(static_cast<size_t>(t));
  for (int64_t d = 0; d < l.documents; ++d) {
    const int64_t begin = docs.offsets[order[rank[d]]], end = docs.offsets[order[rank[d]] + 1];
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r - begin;
      l.row_slot[r] = (l.offsets[p / chunk] + d) * chunk + p % chunk;
    }
  }
  return l;
}

// The chunked form in ATen operations, from the padded chunk layout (fp32: qc, kc [chunks, Hv,
// chunk, dk], vc [chunks, Hv, chunk, dv], bc, gc [chunks, Hv, chunk]) to the output in the same
// layout: the reference of the CUDA kernels, and the path everywhere else. `initial` (undefined:
// zeros) and `*final` (when given) are the states [layout.documents, Hv, dk, dv] fp32, in the
// layout's sorted order, before the first and after the last row of each document.
at::Tensor ChunkedInAten(const at::Tensor& qc, const at::Tensor& kc, const at::Tensor& vc,
                         const at::Tensor& bc_rows, const at::Tensor& gc, const ChunkLayout& layout,
                         const at::Tensor& initial = {}, at::Tensor* final = nullptr) {
  const int64_t n = qc.size(0), hv = qc.size(1), chunk = qc.size(2), dk = qc.size(3);
  const int64_t dv = vc.size(3);
  const at::Tensor bc = bc_rows.unsqueeze(-1);  // [chunks, Hv, chunk, 1]
  const at::Tensor cum = gc.cumsum(-1);         // [chunks, Hv, chunk]: log decay so far

  // Within a chunk: decay between rows j <= i, the UT system and the chunk's own attention.
  const at::Tensor upper = at::ones({chunk, chunk}, qc.options().dtype(at::kBool)).triu(1);
  const at::Tensor decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2))
                               .masked_fill(upper, -std::numeric_limits<double>::infinity())
                               .exp();
  const at::Tensor k_beta = kc * bc;
  const at::Tensor kt = kc.transpose(-1, -2);
  const at::Tensor ut = k_beta.matmul(kt) * decay;
  const at::Tensor intra = qc.matmul(kt) * decay;
  const at::Tensor cum_exp = cum.exp().unsqueeze(-1);
  // (I + strictly_lower(ut))^-1 applied to the chunk's writes and its decayed keys.
  const at::Tensor new_values =
      at::linalg_solve_triangular(ut, vc * bc, /*upper=*/false, /*left=*/true,
                                  /*unitriangular=*/true);
  const at::Tensor k_cumdecay =
      at::linalg_solve_triangular(ut, k_beta * cum_exp, /*upper=*/false, /*left=*/true,
                                  /*unitriangular=*/true);
  const at::Tensor q_decayed = qc * cum_exp;
  const at::Tensor last = cum.narrow(-1, chunk - 1, 1);  // [chunks, Hv, 1]
  const at::Tensor k_decayed_t = (kc * (last - cum).exp().unsqueeze(-1)).transpose(-1, -2);
  const at::Tensor chunk_decay = last.exp().unsqueeze(-1);  // [chunks, Hv, 1, 1]

  // Across chunks: one state [dk, dv] per (document, head), carried chunk to chunk; step j runs
  // chunk j of every document that has one.
  at::Tensor state = initial.defined() ? initial.to(at::kFloat).clone()
                                       : at::zeros({layout.documents, hv, dk, dv}, qc.options());
  at::Tensor out = at::empty({n, hv, chunk, dv}, qc.options());
  for (size_t j = 0; j < layout.offsets.size(); ++j) {
    const int64_t first = layout.offsets[j], a = layout.active[j];
    at::Tensor s = state.narrow(0, 0, a);
    auto at_step = [&](const at::Tensor& x) { return x.narrow(0, first, a); };
    at::Tensor v_new = at_step(new_values) - at_step(k_cumdecay).matmul(s);
    out.narrow(0, first, a).copy_(at_step(q_decayed).matmul(s) + at_step(intra).matmul(v_new));
    s.copy_(s * at_step(chunk_decay) + at_step(k_decayed_t).matmul(v_new));
  }
  if (final != nullptr) *final = state;
  return out;
}

// The ATen path of the chunked scan over packed rows (q, k, v, g, beta as GatedDeltaRuleChunked
// takes them), with each document's state before (`initial`, [documents of docs, Hv, dk, dv]
// fp32 in docs' order; undefined: zeros) and after (`*final`, same layout; every document of docs
// needs a row then).
at::Tensor ChunkedPacked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& g, const at::Tensor& beta, const VarlenDocs& docs,
                         const ChunkLayout& layout, int64_t chunk, const at::Tensor& initial,
                         at::Tensor* final) {
  const int64_t hv = q.size(1), dk = q.size(2), dv = v.size(2), n = layout.chunks;
  const at::Tensor slot = at::tensor(layout.row_slot, at::kLong).to(q.device());
  const at::TensorOptions f32 = q.options().dtype(at::kFloat);
  // [T, Hv, X...] -> [chunks, Hv, chunk, X...], fp32, contiguous.
  auto pad = [&](const at::Tensor& x) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] = n * chunk;
    at::Tensor p = at::zeros(shape, f32);
    p.index_copy_(0, slot, x.to(at::kFloat));
    shape[0] = chunk;
    shape.insert(shape.begin(), n);
    p = p.view(shape);  // [chunks, chunk, Hv, X...]
    return (x.dim() == 3 ? p.permute({0, 2, 1, 3}) : p.permute({0, 2, 1})).contiguous();
  };
  const at::Tensor qc = pad(L2Norm(q.to(at::kFloat)) * std::pow(static_cast<double>(dk), -0.5));
  const at::Tensor kc = pad(L2Norm(k.to(at::kFloat)));
  const at::Tensor vc = pad(v);
  const at::Tensor bc = pad(beta);  // [chunks, Hv, chunk]
  const at::Tensor gc = pad(g);
  const bool states = initial.defined() || final != nullptr;
  const at::Tensor sorted =
      states ? at::tensor(layout.document, at::kLong).to(q.device()) : at::Tensor();
  at::Tensor sorted_final;
  const at::Tensor out =
      ChunkedInAten(qc, kc, vc, bc, gc, layout,
                    initial.defined() ? initial.index_select(0, sorted) : at::Tensor(),
                    final != nullptr ? &sorted_final : nullptr);
  if (final != nullptr) {
    *final = at::zeros_like(sorted_final).index_copy_(0, sorted, sorted_final);
  }
  return out.permute({0, 2, 1, 3})
      .reshape({n * chunk, hv, dv})
      .index_select(0, slot)
      .to(v.scalar_type());
}

}  // namespace

at::Tensor GatedDeltaRuleChunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& g, const at::Tensor& beta,
                                 const VarlenDocs& docs, int64_t chunk, bool fused) {
  const int64_t t = q.size(0), hv = q.size(1), dk = q.size(2), dv = v.size(2);
  if (t == 0) return at::empty({0, hv, dv}, v.options());
  // Padding rows have k = v = beta = 0 and g = 0 (no decay): they leave the state untouched and
  // their outputs are dropped.
  const ChunkLayout layout = MakeChunkLayout(docs, t, chunk);
  const int64_t n = layout.chunks;
#ifdef DFLASH_HAVE_GATED_DELTA_SCAN
  // On CUDA: two kernels read the packed rows and write the packed output (no padded copies).
  const c10::ScalarType dtype = v.scalar_type();
  if (fused && q.is_cuda() &&
      kernels::SupportsGatedDeltaRule(dk, dv, chunk, layout.documents, dtype)) {
    kernels::GatedDeltaLayout l;
    l.rows.assign(static_cast<size_t>(n * chunk), -1);
    for (int64_t r = 0; r < t; ++r) l.rows[layout.row_slot[r]] = static_cast<int32_t>(r);
    l.offsets = layout.offsets;
    l.active = layout.active;
    l.documents = layout.documents;
    return kernels::GatedDeltaRuleCuda(q.to(dtype), k.to(dtype), v, g.to(at::kFloat),
                                       beta.to(dtype), l);
  }
#endif
  return ChunkedPacked(q, k, v, g, beta, docs, layout, chunk, at::Tensor(), nullptr);
}

at::Tensor GatedDeltaRuleReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, const at::Tensor& beta,
                                   const VarlenDocs& docs) {
  const int64_t hv = q.size(1), dk = q.size(2), dv = v.size(2);
  const at::Tensor qf = L2Norm(q.to(at::kFloat)) * std::pow(static_cast<double>(dk), -0.5);
  const at::Tensor kf = L2Norm(k.to(at::kFloat));
  const at::Tensor vf = v.to(at::kFloat);
  const at::Tensor decay = g.to(at::kFloat).exp();
  const at::Tensor bf = beta.to(at::kFloat);
  at::Tensor out = at::zeros({q.size(0), hv, dv}, vf.options());
  for (size_t d = 0; d + 1 < docs.offsets.size(); ++d) {
    at::Tensor state = at::zeros({hv, dk, dv}, vf.options());
    for (int64_t r = docs.offsets[d]; r < docs.offsets[d + 1]; ++r) {
      state = state * decay[r].view({hv, 1, 1});
      const at::Tensor kr = kf[r].unsqueeze(-1);  // [Hv, dk, 1]
      const at::Tensor delta = (vf[r] - (state * kr).sum(1)) * bf[r].unsqueeze(-1);
      state = state + kr * delta.unsqueeze(1);
      out[r].copy_((state * qf[r].unsqueeze(-1)).sum(1));
    }
  }
  return out.to(v.scalar_type());
}

at::Tensor GatedDeltaNet(const at::Tensor& x, const GatedDeltaWeights& w, const GatedDeltaDims& d,
                         const VarlenDocs& docs) {
  const int64_t t = x.size(0), hv = d.num_v_heads, dv = d.v_head_dim, vd = d.value_dim();
  const int64_t cd = d.conv_dim();
  const at::Tensor proj = Linear(x, w.in_proj);  // [T, conv_dim + Vd + 2*Hv]
  const at::Tensor mixed = at::silu(CausalConv1dVarlen(proj.narrow(1, 0, cd), w.conv, docs));
  const at::Tensor z = proj.narrow(1, cd, vd).reshape({t, hv, dv});
  const at::Tensor beta = proj.narrow(1, cd + vd, hv).sigmoid();
  // HF: g = -exp(A_log) * softplus(a + dt_bias), in fp32.
  const at::Tensor g = -w.a_log.to(at::kFloat).exp() *
                       at::softplus(proj.narrow(1, cd + vd + hv, hv).to(at::kFloat) + w.dt_bias);
  const auto [q, k, v] = SplitHeads(mixed, d);
  const at::Tensor core = GatedDeltaRuleChunked(q, k, v, g, beta, docs);
  return Linear(GatedRmsNorm(core, z, w.norm, d.eps).reshape({t, vd}), w.out_proj);
}

namespace {

// GatedDeltaNetExtend for n sequences (`idx`, on the states' device) extended by c rows each, their
// rows consecutive from `begin`: the convolution over each one's last K-1 rows and its new ones
// (CausalConv1dVarlen's arithmetic: fp32, then the input's dtype), then GatedDeltaRuleReference's
// recurrence from each one's state, into core [T, Hv, dv]; the conv rows and states updated.
void ExtendGroup(const at::Tensor& proj, const at::Tensor& decay, const at::Tensor& beta,
                 const at::Tensor& wf, const GatedDeltaDims& d, const at::Tensor& idx,
                 int64_t begin, int64_t c, c10::ScalarType dtype, at::Tensor* conv,
                 at::Tensor* state, at::Tensor* core) {
  const int64_t n = idx.size(0), hk = d.num_k_heads, hv = d.num_v_heads;
  const int64_t dk = d.k_head_dim, dv = d.v_head_dim, kd = d.key_dim(), vd = d.value_dim();
  const int64_t cd = d.conv_dim(), kernel = d.conv_kernel;
  const at::Tensor pre = at::cat(
      {conv->index_select(0, idx), proj.narrow(0, begin, n * c).narrow(1, 0, cd).view({n, c, cd})},
      1);
  const at::Tensor windows = pre.to(at::kFloat).unfold(1, kernel, 1);  // [n, c, cd, K]
  const at::Tensor mixed = at::silu((windows * wf).sum(-1).to(dtype));
  conv->index_copy_(0, idx, pre.narrow(1, c, kernel - 1).contiguous());
  at::Tensor q = mixed.narrow(2, 0, kd).reshape({n, c, hk, dk});
  at::Tensor k = mixed.narrow(2, kd, kd).reshape({n, c, hk, dk});
  const at::Tensor v = mixed.narrow(2, 2 * kd, vd).reshape({n, c, hv, dv}).to(at::kFloat);
  if (hv != hk) {  // key head i serves value heads i*r .. i*r + r-1
    q = q.unsqueeze(3).expand({n, c, hk, hv / hk, dk}).reshape({n, c, hv, dk});
    k = k.unsqueeze(3).expand({n, c, hk, hv / hk, dk}).reshape({n, c, hv, dk});
  }
  const at::Tensor qf = L2Norm(q.to(at::kFloat)) * std::pow(static_cast<double>(dk), -0.5);
  const at::Tensor kf = L2Norm(k.to(at::kFloat));
  const at::Tensor dec = decay.narrow(0, begin, n * c).view({n, c, hv});
  const at::Tensor bet = beta.narrow(0, begin, n * c).view({n, c, hv});
  at::Tensor st = state->index_select(0, idx);  // [n, Hv, dk, dv]
  at::Tensor out = core->narrow(0, begin, n * c).view({n, c, hv, dv});
  for (int64_t r = 0; r < c; ++r) {
    st = st * dec.select(1, r).view({n, hv, 1, 1});
    const at::Tensor kr = kf.select(1, r).unsqueeze(-1);  // [n, Hv, dk, 1]
    const at::Tensor delta =
        (v.select(1, r) - (st * kr).sum(2)) * bet.select(1, r).unsqueeze(-1);  // [n, Hv, dv]
    st = st + kr * delta.unsqueeze(2);
    out.select(1, r).copy_((st * qf.select(1, r).unsqueeze(-1)).sum(2));
  }
  state->index_copy_(0, idx, st);
}

// GatedDeltaNetExtend's long extensions (prefills, replays): every sequence with new rows in one
// pass. The convolution runs over each sequence's K-1 held rows followed by its new ones (as
// documents of CausalConv1dVarlen, so the held rows are the window's history), and the scan is
// the chunked form (ChunkedPacked) from each sequence's state, whose final states it writes back.
// `counts[i]` rows of x continue sequence `sequences[i]` (rows in that order, none for count 0).
void ExtendChunked(const at::Tensor& proj, const at::Tensor& g, const at::Tensor& beta,
                   const GatedDeltaWeights& w, const GatedDeltaDims& d,
                   const std::vector<int64_t>& sequences, const std::vector<int64_t>& counts,
                   c10::ScalarType dtype, at::Tensor* conv, at::Tensor* state, at::Tensor* core) {
  const int64_t cd = d.conv_dim(), held = d.conv_kernel - 1;
  std::vector<int64_t> seqs, pre_offsets = {0}, row_offsets = {0}, new_rows, tail_rows;
  std::vector<at::Tensor> pieces;
  int64_t begin = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t c = counts[i];
    if (c == 0) continue;
    seqs.push_back(sequences[i]);
    const int64_t start = pre_offsets.back();
    pieces.push_back(conv->select(0, sequences[i]));
    pieces.push_back(proj.narrow(0, begin, c).narrow(1, 0, cd));
    for (int64_t r = 0; r < c; ++r) new_rows.push_back(start + held + r);
    for (int64_t r = 0; r < held; ++r) tail_rows.push_back(start + c + r);
    pre_offsets.push_back(start + held + c);
    row_offsets.push_back(row_offsets.back() + c);
    begin += c;
  }
  const c10::Device device = proj.device();
  const at::TensorOptions long_opts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor idx = at::tensor(seqs, long_opts).to(device);
  const at::Tensor pre = at::cat(pieces, 0).to(dtype);  // [sum(K-1 + c), conv_dim]
  VarlenDocs pre_docs;
  pre_docs.offsets = pre_offsets;
  const at::Tensor mixed = at::silu(CausalConv1dVarlen(pre, w.conv, pre_docs))
                               .index_select(0, at::tensor(new_rows, long_opts).to(device));
  conv->index_copy_(0, idx,
                    pre.index_select(0, at::tensor(tail_rows, long_opts).to(device))
                        .view({idx.size(0), held, cd}));
  const int64_t t = mixed.size(0);
  const auto [q, k, v] = SplitHeads(mixed, d);
  VarlenDocs docs;
  docs.offsets = row_offsets;
  const int64_t chunk = 64;
  const ChunkLayout layout = MakeChunkLayout(docs, t, chunk);
  at::Tensor final;
  core->copy_(
      ChunkedPacked(q, k, v, g, beta, docs, layout, chunk, state->index_select(0, idx), &final));
  state->index_copy_(0, idx, final);
}

}  // namespace

at::Tensor GatedDeltaNetExtend(const at::Tensor& x, const GatedDeltaWeights& w,
                               const GatedDeltaDims& d, const std::vector<int64_t>& sequences,
                               const std::vector<int64_t>& offsets, at::Tensor* conv,
                               at::Tensor* state, int64_t chunked_from) {
  const int64_t t = x.size(0), hv = d.num_v_heads, dv = d.v_head_dim, vd = d.value_dim();
  const int64_t cd = d.conv_dim();
  const at::Tensor proj = Linear(x, w.in_proj);  // [T, conv_dim + Vd + 2*Hv]
  const at::Tensor wf = w.conv.to(at::kFloat);   // [conv_dim, K]
  const at::Tensor z = proj.narrow(1, cd, vd).reshape({t, hv, dv});
  const at::Tensor beta = proj.narrow(1, cd + vd, hv).sigmoid().to(at::kFloat);
  const at::Tensor g = -w.a_log.to(at::kFloat).exp() *
                       at::softplus(proj.narrow(1, cd + vd + hv, hv).to(at::kFloat) + w.dt_bias);
  at::Tensor core = at::empty({t, hv, dv}, proj.options().dtype(at::kFloat));
  const int64_t n = static_cast<int64_t>(sequences.size());
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < n; ++i) counts.push_back(offsets[i + 1] - offsets[i]);
  if (!counts.empty() && *std::max_element(counts.begin(), counts.end()) >= chunked_from) {
    ExtendChunked(proj, g, beta, w, d, sequences, counts, x.scalar_type(), conv, state, &core);
    return Linear(GatedRmsNorm(core.to(x.scalar_type()), z, w.norm, d.eps).reshape({t, vd}),
                  w.out_proj);
  }
  const at::Tensor decay = g.exp();
  const at::TensorOptions long_opts = at::TensorOptions().dtype(at::kLong);
  const int64_t count0 = counts.empty() ? 0 : counts[0];  // no sequences: no rows, none run
  bool uniform = count0 > 0;
  for (int64_t i = 1; i < n && uniform; ++i) uniform = offsets[i + 1] - offsets[i] == count0;
  if (uniform) {
    // Every sequence extended by the same count (decoding steps, verification blocks): batched
    // over the sequences, one recurrence loop over the count.
    ExtendGroup(proj, decay, beta, wf, d, at::tensor(sequences, long_opts).to(conv->device()), 0,
                count0, x.scalar_type(), conv, state, &core);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t count = offsets[i + 1] - offsets[i];
      if (count == 0) continue;
      const std::vector<int64_t> one = {sequences[static_cast<size_t>(i)]};
      ExtendGroup(proj, decay, beta, wf, d, at::tensor(one, long_opts).to(conv->device()),
                  offsets[i], count, x.scalar_type(), conv, state, &core);
    }
  }
  return Linear(GatedRmsNorm(core.to(x.scalar_type()), z, w.norm, d.eps).reshape({t, vd}),
                w.out_proj);
}

}  // namespace dflash::nn

#include "common/nn/moe.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_grouped_mm.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros_like.h>

#include <tuple>

#include "common/nn/layers.h"

namespace dflash::nn {

namespace {

// The routed experts' sum, [T, H].
at::Tensor RoutedExperts(const at::Tensor& x, const MoeWeights& w, bool grouped_gemm) {
  const int64_t experts = w.router.size(0), inter = w.down.size(2), k = w.top_k;
  at::Tensor probs = at::softmax(at::mm(x, w.router.t()), 1, at::kFloat);  // [T, E] fp32
  auto [weights, chosen] = at::topk(probs, k, 1);                          // [T, K] each
  if (w.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());

  // The T*K (token, expert) pairs sorted by expert (stable: tokens in order within an expert).
  at::Tensor flat = chosen.reshape({-1});
  at::Tensor order = at::argsort(flat, /*stable=*/true);
  at::Tensor token = at::div(order, k, /*rounding_mode=*/"floor");
  at::Tensor pair_weight = weights.reshape({-1}).index_select(0, order);
  at::Tensor counts = at::bincount(flat, /*weights=*/{}, experts);
  at::Tensor rows = x.index_select(0, token);  // [T*K, H]
  if (grouped_gemm && x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.size(1) % 8 == 0 &&
      inter % 8 == 0) {
    // Each expert's rows end at offs[e] (cumulative counts); the weights are read transposed in
    // place ([E, H, 2I] and [E, I, H] column-major views).
    at::Tensor offs = at::cumsum(counts, 0, at::kInt);
    at::Tensor gate_up = at::_grouped_mm(rows, w.gate_up.transpose(1, 2), offs);  // [T*K, 2I]
    at::Tensor act = SwiGluHalves(gate_up);  // one pass on CUDA (layers.h)
    at::Tensor out = at::_grouped_mm(act, w.down.transpose(1, 2), offs);  // [T*K, H]
    out.mul_(pair_weight.unsqueeze(1));
    return at::zeros_like(x).index_add_(0, token, out);
  }
  counts = counts.to(at::kCPU);
  at::Tensor out = at::empty(rows.sizes(), rows.options());
  const int64_t* count = counts.data_ptr<int64_t>();
  int64_t begin = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = count[e];
    if (n == 0) continue;
    at::Tensor gate_up = at::mm(rows.narrow(0, begin, n), w.gate_up[e].t());  // [n, 2I]
    at::Tensor act = SwiGluHalves(gate_up);  // one pass on CUDA (layers.h)
    at::Tensor slice = out.narrow(0, begin, n);
    at::mm_out(slice, act, w.down[e].t());
    begin += n;
  }
  out.mul_(pair_weight.unsqueeze(1));
  return at::zeros_like(x).index_add_(0, token, out);
}

}  // namespace

at::Tensor MoeMlp(const at::Tensor& x, const MoeWeights& w, bool grouped_gemm) {
  at::Tensor out = RoutedExperts(x, w, grouped_gemm);
  if (!w.shared_gate_up.defined()) return out;
  // transformers' Qwen3NextSparseMoeBlock: + sigmoid(shared_expert_gate(x)) * shared_expert(x).
  const at::Tensor act = SwiGluHalves(at::mm(x, w.shared_gate_up.t()));  // [T, 2Is] -> [T, Is]
  return out + at::mm(x, w.shared_gate.t()).sigmoid() * at::mm(act, w.shared_down.t());
}

}  // namespace dflash::nn

// The one file of the fused cross-entropy that sees LibTorch: validates tensors, runs the GEMMs,
// fills FusedCeParams for the row kernel, and wires the result into autograd.
#include "common/kernels/fused_ce/fused_ce.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "common/kernels/fused_ce/params.h"
#include "common/kernels/launch_check.h"

namespace dflash::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

CeDType ToCeDType(c10::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return CeDType::kFloat32;
    case at::kBFloat16:
      return CeDType::kBFloat16;
    case at::kHalf:
      return CeDType::kFloat16;
    default:
      TORCH_CHECK(false, "fused CE: lm_head dtype ", t, " is not fp32, bf16 or fp16");
  }
}

// The chunk loop: per row the CE, `correct`, the top_k indices and w * d CE / d hidden (and
// d lm_head when asked), computed in the forward.
struct FusedPass {
  at::Tensor loss, correct, top, grad_hidden, grad_head;
};

FusedPass RunFusedPass(const at::Tensor& hidden, const at::Tensor& lm_head,
                       const at::Tensor& labels, const at::Tensor& weights, int64_t chunk_rows,
                       bool lm_head_grad, int64_t top_k) {
  const int64_t rows = hidden.size(0), vocab = lm_head.size(0);
  const at::Tensor head = lm_head.contiguous();
  FusedPass r;
  r.loss = at::empty({rows}, hidden.options().dtype(at::kFloat));
  r.correct = at::empty({rows}, hidden.options().dtype(at::kBool));
  r.grad_hidden = at::empty_like(hidden, at::MemoryFormat::Contiguous);
  if (lm_head_grad) r.grad_head = at::zeros_like(head);
  r.top = at::empty({rows, top_k}, hidden.options().dtype(at::kLong));
  const at::Tensor labels_c = labels.contiguous(), weights_c = weights.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(hidden.device().index()).stream();
  for (int64_t s = 0; s < rows; s += chunk_rows) {
    const int64_t m = std::min(chunk_rows, rows - s);
    const at::Tensor h = hidden.narrow(0, s, m).to(head.scalar_type()).contiguous();
    at::Tensor logits = at::matmul(h, head.t());  // [m, V], the one chunk alive
    // Before the row kernel turns the logits into their gradient.
    if (top_k > 0) r.top.narrow(0, s, m).copy_(std::get<1>(at::topk(logits, top_k, 1)));
    FusedCeParams p;
    p.logits = logits.data_ptr();
    p.dtype = ToCeDType(logits.scalar_type());
    p.rows = m;
    p.vocab = vocab;
    p.ld = logits.stride(0);
    p.labels = labels_c.data_ptr<int64_t>() + s;
    p.weights = weights_c.data_ptr<float>() + s;
    p.loss = r.loss.data_ptr<float>() + s;
    p.correct = r.correct.data_ptr<bool>() + s;
    CheckLaunch(LaunchFusedCeRows(p, stream), "fused CE kernel launch");
    // logits now hold dlogits; the rows of grad_hidden are contiguous, so the GEMM writes them.
    at::Tensor rows_out = r.grad_hidden.narrow(0, s, m);
    if (r.grad_hidden.scalar_type() == head.scalar_type()) {
      at::matmul_out(rows_out, logits, head);
    } else {
      rows_out.copy_(at::matmul(logits, head));
    }
    if (lm_head_grad) r.grad_head.addmm_(logits.t(), h);
  }
  return r;
}

struct FusedCeFunction : public torch::autograd::Function<FusedCeFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& lm_head, const at::Tensor& labels,
                               const at::Tensor& weights, int64_t chunk_rows, bool lm_head_grad,
                               int64_t top_k) {
    FusedPass r = RunFusedPass(hidden, lm_head, labels, weights, chunk_rows, lm_head_grad, top_k);
    ctx->saved_data["grad_hidden"] = r.grad_hidden;
    if (lm_head_grad) ctx->saved_data["grad_head"] = r.grad_head;
    ctx->mark_non_differentiable({r.correct, r.top});
    return {(r.loss * weights.contiguous()).sum(), r.correct, r.top};
  }

  // The gradients were computed in forward; the numerator's incoming gradient is a scalar.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    at::Tensor grad_hidden, grad_head;
    if (grad_outputs[0].defined()) {
      // A 0-dim factor keeps the saved gradient's dtype: no fp32 copy of [N, H] (measured: it was
      // the op's peak, 0.375 GiB at N = 8192, H = 4096).
      const at::Tensor g = grad_outputs[0];
      grad_hidden = ctx->saved_data["grad_hidden"].toTensor().mul(g);
      if (ctx->saved_data.count("grad_head")) {
        grad_head = ctx->saved_data["grad_head"].toTensor().mul(g);
      }
    }
    return {grad_hidden,  grad_head,    at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void CheckInputs(const at::Tensor& hidden, const at::Tensor& lm_head, const at::Tensor& labels,
                 const at::Tensor& weights, int64_t chunk_rows, int64_t top_k) {
  TORCH_CHECK(hidden.is_cuda() && lm_head.device() == hidden.device() &&
                  labels.device() == hidden.device() && weights.device() == hidden.device(),
              "fused CE: hidden, lm_head, labels and weights must be on one CUDA device");
  TORCH_CHECK(hidden.dim() == 2 && lm_head.dim() == 2 && hidden.size(1) == lm_head.size(1),
              "fused CE: hidden ", hidden.sizes(), " and lm_head ", lm_head.sizes(),
              " must be [N, H] and [V, H]");
  TORCH_CHECK(
      labels.dim() == 1 && labels.size(0) == hidden.size(0) && labels.scalar_type() == at::kLong,
      "fused CE: labels must be [", hidden.size(0), "] int64");
  TORCH_CHECK(weights.dim() == 1 && weights.size(0) == hidden.size(0) &&
                  weights.scalar_type() == at::kFloat,
              "fused CE: weights must be [", hidden.size(0), "] fp32");
  TORCH_CHECK(chunk_rows >= 1, "fused CE: chunk_rows must be at least 1, got ", chunk_rows);
  TORCH_CHECK(top_k >= 0 && top_k <= lm_head.size(0), "fused CE: top_k must be in 0..",
              lm_head.size(0), " (the vocabulary), got ", top_k);
}

}  // namespace

FusedCeResult FusedWeightedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                                        const at::Tensor& labels, const at::Tensor& weights,
                                        int64_t chunk_rows, bool lm_head_grad, int64_t top_k) {
  CheckInputs(hidden, lm_head, labels, weights, chunk_rows, top_k);
  TORCH_CHECK(!lm_head_grad || lm_head.requires_grad(),
              "fused CE: lm_head_grad needs an lm_head that requires grad");
  const c10::cuda::CUDAGuard guard(hidden.device());
  variable_list out = FusedCeFunction::apply(hidden, lm_head_grad ? lm_head : lm_head.detach(),
                                             labels, weights, chunk_rows, lm_head_grad, top_k);
  return FusedCeResult{out[0], out[1], top_k > 0 ? out[2] : at::Tensor()};
}

FusedCeRows FusedCrossEntropyRows(const at::Tensor& hidden, const at::Tensor& lm_head,
                                  const at::Tensor& labels, int64_t chunk_rows, int64_t top_k) {
  const at::Tensor ones = at::ones({hidden.size(0)}, hidden.options().dtype(at::kFloat));
  CheckInputs(hidden, lm_head, labels, ones, chunk_rows, top_k);
  const c10::cuda::CUDAGuard guard(hidden.device());
  at::NoGradGuard no_grad;
  FusedPass r = RunFusedPass(hidden.detach(), lm_head.detach(), labels, ones, chunk_rows,
                             /*lm_head_grad=*/false, top_k);
  return FusedCeRows{r.loss, r.correct, top_k > 0 ? r.top : at::Tensor(), r.grad_hidden};
}

}  // namespace dflash::kernels

#include "common/drafter/lean_ops.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "common/drafter/fp8_linear.h"
#ifdef DFLASH_HAVE_FUSED_SWIGLU
#include "common/kernels/swiglu/swiglu.h"
#endif

namespace dflash::drafter {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::ScalarType SavedDtype(AutogradContext* ctx) {
  return static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
}

// dW = dY^T X over every leading dimension, in the compute dtype, returned in `weight_dtype`:
// what autograd computes for linear(x, w.to(dtype)) followed by the cast's backward. On CUDA, a
// bf16 / fp16 product for an fp32 weight is written in fp32 by the GEMM itself (its fp32
// accumulator, not rounded to bf16 first): no [Out, In] bf16 result and no cast pass over it.
at::Tensor WeightGrad(const at::Tensor& dy, const at::Tensor& x, c10::ScalarType weight_dtype) {
  const at::Tensor dy2 = dy.reshape({-1, dy.size(-1)});
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  const c10::ScalarType in = dy2.scalar_type();
  if (dy2.is_cuda() && weight_dtype == at::kFloat && (in == at::kBFloat16 || in == at::kHalf) &&
      x2.scalar_type() == in) {
    return at::mm(dy2.t(), x2, at::kFloat);
  }
  return dy2.t().mm(x2).to(weight_dtype);
}

struct CastLinearFunction : public torch::autograd::Function<CastLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            c10::ScalarType dtype) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    return at::linear(x, weight.to(dtype));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const at::Tensor& dy = grads[0];
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = at::matmul(dy, weight.to(SavedDtype(ctx)));
    if (ctx->needs_input_grad(1)) dw = WeightGrad(dy, x, weight.scalar_type());
    return {dx, dw, at::Tensor()};
  }
};

// x [..., In] -> [rows, In]: the products below work on matrices.
at::Tensor Rows2d(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// x W_i^T for every weight, as CastLinear's forward (or with fp8 the e4m3 GEMMs, x quantized once
// for all of them), each shaped as x with its last dimension W_i's rows.
std::vector<at::Tensor> SharedProducts(const at::Tensor& x, at::TensorList weights,
                                       c10::ScalarType dtype, bool fp8) {
  std::vector<at::Tensor> out;
  std::vector<int64_t> shape = x.sizes().vec();
  std::optional<Fp8Rows> xq;
  for (const at::Tensor& w : weights) {
    shape.back() = w.size(0);
    if (!fp8) {
      out.push_back(at::linear(x, w.to(dtype)));
      continue;
    }
    if (!xq) xq = QuantizeRowsE4m3(Rows2d(x));
    out.push_back(ScaledMatmulNT(*xq, QuantizeRowsE4m3(w), dtype).view(shape));
  }
  return out;
}

// The gradients of SharedProducts given each product's gradient dys[i] (undefined: none): x's
// (when want_dx), their sum added by each GEMM into the previous one's output (fp8: summed), and
// weight i's (when want_dw[i] and dys[i] is defined), in the weight's dtype; in fp8 x's column
// quantization made once for all of them.
struct SharedGrads {
  at::Tensor dx;
  std::vector<at::Tensor> dw;
};
SharedGrads SharedProductGrads(const at::Tensor& x, at::TensorList weights,
                               const std::vector<at::Tensor>& dys, c10::ScalarType dtype, bool fp8,
                               bool want_dx, const std::vector<bool>& want_dw) {
  const at::Tensor x2 = Rows2d(x);
  SharedGrads g;
  std::optional<Fp8Rows> xc;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    g.dw.emplace_back();
    if (!dys[i].defined()) continue;
    const at::Tensor dy = Rows2d(dys[i]);
    if (want_dx) {
      if (fp8) {
        const at::Tensor p = Fp8InputGrad(dy, w, dtype);
        g.dx = g.dx.defined() ? g.dx.add_(p) : p;
      } else {
        g.dx = g.dx.defined() ? g.dx.addmm_(dy, w.to(dtype)) : at::mm(dy, w.to(dtype));
      }
    }
    if (!want_dw[i]) continue;
    if (fp8) {
      if (!xc) xc = QuantizeColumnsE4m3(x2);
      g.dw.back() = ScaledMatmulNT(QuantizeColumnsE4m3(dy), *xc, dtype).to(w.scalar_type());
    } else {
      g.dw.back() = WeightGrad(dy, x2, w.scalar_type());
    }
  }
  if (g.dx.defined()) g.dx = g.dx.view(x.sizes());
  return g;
}

struct SharedInputLinearFunction : public torch::autograd::Function<SharedInputLinearFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                               c10::ScalarType dtype, bool fp8) {
    std::vector<at::Tensor> keep = {x};
    keep.insert(keep.end(), weights.begin(), weights.end());
    ctx->save_for_backward(keep);
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["fp8"] = fp8;
    ctx->set_materialize_grads(false);  // an unused output: no zeros, no products for it
    return SharedProducts(x, weights, dtype, fp8);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::TensorList weights = at::TensorList(saved).slice(1);
    std::vector<bool> want_dw;
    for (size_t i = 0; i < weights.size(); ++i) want_dw.push_back(ctx->needs_input_grad(i + 1));
    SharedGrads g =
        SharedProductGrads(saved[0], weights, grads, SavedDtype(ctx),
                           ctx->saved_data["fp8"].toBool(), ctx->needs_input_grad(0), want_dw);
    variable_list out = {g.dx};
    out.insert(out.end(), g.dw.begin(), g.dw.end());
    out.push_back(at::Tensor());  // dtype
    out.push_back(at::Tensor());  // fp8
    return out;
  }
};

// The MLP's products: in the compute dtype (the weight cast), or with `fp8` as fp8_linear.h's
// e4m3 GEMMs.
struct MlpProducts {
  c10::ScalarType dtype;
  bool fp8;
  at::Tensor Forward(const at::Tensor& x, const at::Tensor& w) const {  // x W^T
    return fp8 ? Fp8Forward(x, w, dtype) : at::linear(x, w.to(dtype));
  }
  at::Tensor InputGrad(const at::Tensor& dy, const at::Tensor& w) const {  // dY W
    return fp8 ? Fp8InputGrad(dy, w, dtype) : at::matmul(dy, w.to(dtype));
  }
  at::Tensor WeightGrad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w) const {
    return fp8 ? Fp8WeightGrad(dy, x, dtype).to(w.scalar_type())
               : drafter::WeightGrad(dy, x, w.scalar_type());
  }
};

// silu(g) * u: on CUDA in one pass (common/kernels/swiglu), else LibTorch's two kernels.
at::Tensor SiluTimes(const at::Tensor& g, const at::Tensor& u) {
#ifdef DFLASH_HAVE_FUSED_SWIGLU
  if (kernels::SupportsFusedSwiGlu(g, u)) return kernels::FusedSwiGlu(g, u);
#endif
  return at::silu(g) * u;
}

bool FusedSwiGluBackwardFor(const at::Tensor& g, const at::Tensor& u) {
#ifdef DFLASH_HAVE_FUSED_SWIGLU
  return kernels::SupportsFusedSwiGlu(g, u);
#else
  (void)g;
  (void)u;
  return false;
#endif
}

struct SwiGluMlpFunction : public torch::autograd::Function<SwiGluMlpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& gate,
                            const at::Tensor& up, const at::Tensor& down, c10::ScalarType dtype,
                            bool recompute_projections, bool fp8) {
    const MlpProducts mm{dtype, fp8};
    const std::vector<at::Tensor> gu = SharedProducts(h, {gate, up}, dtype, fp8);
    const at::Tensor &g = gu[0], &u = gu[1];
    at::Tensor out = mm.Forward(SiluTimes(g, u), down);
    if (recompute_projections) {
      ctx->save_for_backward({h, gate, up, down});
    } else {
      ctx->save_for_backward({h, gate, up, down, g, u});
    }
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["fp8"] = fp8;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &gate = saved[1], &up = saved[2], &down = saved[3];
    const MlpProducts mm{SavedDtype(ctx), ctx->saved_data["fp8"].toBool()};
    // The same products as the forward's, so the same values.
    at::Tensor g, u;
    if (saved.size() > 4) {
      g = saved[4];
      u = saved[5];
    } else {
      std::vector<at::Tensor> gu = SharedProducts(h, {gate, up}, mm.dtype, mm.fp8);
      g = std::move(gu[0]);
      u = std::move(gu[1]);
    }
    const at::Tensor& dout = grads[0];
    at::Tensor dg, du;
    if (FusedSwiGluBackwardFor(g, u)) {
      // One pass for silu(g) * u (down's weight gradient), one for both gradients, written over
      // the product's gradient: at most four [N, I] tensors at once (g, u, da = dg, du).
#ifdef DFLASH_HAVE_FUSED_SWIGLU
      at::Tensor d_down;
      if (ctx->needs_input_grad(3)) d_down = mm.WeightGrad(dout, SiluTimes(g, u), down);
      std::tie(dg, du) = kernels::FusedSwiGluBackward(mm.InputGrad(dout, down), g, u);
      g.reset();
      u.reset();
      return InputAndWeightGrads(ctx, mm, h, gate, up, dg, du, d_down);
#endif
    }
    // The product's gradient, then mul's and silu's backward as autograd writes them, with the
    // same kernels (so the same values) but in place where autograd would allocate: at most four
    // [N, I] tensors at once (g, u, silu(g), the product's gradient), not six; recomputed g and u
    // are freed as soon as they are used.
    at::Tensor s = at::silu(g);
    at::Tensor d_down;
    if (ctx->needs_input_grad(3)) d_down = mm.WeightGrad(dout, s * u, down);
    at::Tensor da = mm.InputGrad(dout, down);
    du = da * s;
    s.reset();
    da.mul_(u);  // d(silu(g)) = da * u
    u.reset();
    dg = at::silu_backward_out(da, da, g);
    g.reset();
    da.reset();
    return InputAndWeightGrads(ctx, mm, h, gate, up, dg, du, d_down);
  }

  // The projections' gradients from those of g = h gate^T and u = h up^T (SharedProductGrads).
  static variable_list InputAndWeightGrads(AutogradContext* ctx, const MlpProducts& mm,
                                           const at::Tensor& h, const at::Tensor& gate,
                                           const at::Tensor& up, const at::Tensor& dg,
                                           const at::Tensor& du, const at::Tensor& d_down) {
    SharedGrads g =
        SharedProductGrads(h, {gate, up}, {dg, du}, mm.dtype, mm.fp8, ctx->needs_input_grad(0),
                           {ctx->needs_input_grad(1), ctx->needs_input_grad(2)});
    return {g.dx, g.dw[0], g.dw[1], d_down, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct GatheredRowLogitsFunction : public torch::autograd::Function<GatheredRowLogitsFunction> {
  // The K table rows of rows [r, r + m): [m, K, H].
  static at::Tensor Rows(const at::Tensor& table, const at::Tensor& index, int64_t r, int64_t m) {
    return table.index_select(0, index.narrow(0, r, m).reshape({-1}))
        .view({m, index.size(1), table.size(1)});
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& table,
                            const at::Tensor& index, int64_t chunk_rows) {
    const int64_t s = hidden.size(0);
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < s; r += chunk_rows) {
      const int64_t m = std::min(chunk_rows, s - r);
      parts.push_back(at::bmm(Rows(table, index, r, m),
                              hidden.narrow(0, r, m).to(table.scalar_type()).unsqueeze(2))
                          .squeeze(2)
                          .to(at::kFloat));
    }
    ctx->save_for_backward({hidden, table, index});
    ctx->saved_data["chunk"] = chunk_rows;
    return parts.empty() ? at::empty({0, index.size(1)}, hidden.options().dtype(at::kFloat))
                         : at::cat(parts, 0);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &table = saved[1], &index = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), s = hidden.size(0);
    at::Tensor dh;
    if (ctx->needs_input_grad(0)) {
      // d hidden[s] = sum_k g[s][k] table[index[s][k]], in the table's dtype as autograd's bmm.
      const at::Tensor g = grads[0].to(table.scalar_type());
      std::vector<at::Tensor> parts;
      for (int64_t r = 0; r < s; r += chunk) {
        const int64_t m = std::min(chunk, s - r);
        parts.push_back(
            at::bmm(g.narrow(0, r, m).unsqueeze(1), Rows(table, index, r, m)).squeeze(1));
      }
      dh = (parts.empty() ? at::empty({0, hidden.size(1)}, table.options()) : at::cat(parts, 0))
               .to(hidden.scalar_type());
    }
    return {dh, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The function a Checkpoint runs twice, kept by the autograd node until its backward.
struct CheckpointedFn : public torch::CustomClassHolder {
  explicit CheckpointedFn(std::function<at::Tensor(const std::vector<at::Tensor>&)> f)
      : fn(std::move(f)) {}
  std::function<at::Tensor(const std::vector<at::Tensor>&)> fn;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList weights,
                            const c10::intrusive_ptr<CheckpointedFn>& fn) {
    // Function::apply runs this without recording: nothing of fn's graph is kept.
    at::Tensor out = fn->fn(inputs.vec());
    // The weights are inputs so that their gradients reach them through this node; fn reads the
    // same tensors itself. Saving them (and the inputs, alive anyway) costs nothing.
    std::vector<at::Tensor> keep = inputs.vec();
    keep.insert(keep.end(), weights.begin(), weights.end());
    ctx->save_for_backward(keep);
    ctx->saved_data["fn"] = at::IValue::make_capsule(fn);
    ctx->saved_data["inputs"] = static_cast<int64_t>(inputs.size());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const auto fn =
        c10::static_intrusive_pointer_cast<CheckpointedFn>(ctx->saved_data["fn"].toCapsule());
    const size_t num_inputs = static_cast<size_t>(ctx->saved_data["inputs"].toInt());
    const size_t num_weights = saved.size() - num_inputs;
    std::vector<at::Tensor> inputs, wrt;
    std::vector<size_t> wrt_index;  // position among the node's inputs
    for (size_t i = 0; i < num_inputs; ++i) {
      inputs.push_back(saved[i].detach().requires_grad_(ctx->needs_input_grad(i)));
      if (ctx->needs_input_grad(i)) {
        wrt.push_back(inputs.back());
        wrt_index.push_back(i);
      }
    }
    at::Tensor out;
    {
      at::AutoGradMode record(true);
      out = fn->fn(inputs);
    }
    // The recomputed graph reads the same leaf weights: their gradients are asked of it (not
    // accumulated there) and returned through this node, which accumulates them, hooks included.
    for (size_t j = 0; j < num_weights; ++j) {
      if (ctx->needs_input_grad(num_inputs + j)) {
        wrt.push_back(saved[num_inputs + j]);
        wrt_index.push_back(num_inputs + j);
      }
    }
    variable_list result(num_inputs + num_weights + 1);
    if (wrt.empty()) return result;
    const variable_list g = torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) result[wrt_index[k]] = g[k];
    return result;
  }
};

}  // namespace

at::Tensor CastLinear(const at::Tensor& x, const at::Tensor& weight, c10::ScalarType dtype) {
  if (weight.scalar_type() == dtype) return at::linear(x, weight);
  return CastLinearFunction::apply(x, weight, dtype);
}

at::Tensor GatheredRowLogits(const at::Tensor& hidden, const at::Tensor& table,
                             const at::Tensor& index, int64_t chunk_rows) {
  TORCH_CHECK(!table.requires_grad(), "GatheredRowLogits: the table gets no gradient");
  return GatheredRowLogitsFunction::apply(hidden, table, index, std::max<int64_t>(1, chunk_rows));
}

at::Tensor Checkpoint(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                      const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& weights) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  return CheckpointFunction::apply(at::TensorList(inputs), at::TensorList(weights),
                                   c10::make_intrusive<CheckpointedFn>(fn));
}

std::vector<at::Tensor> SharedInputLinear(const at::Tensor& x,
                                          const std::vector<at::Tensor>& weights,
                                          c10::ScalarType dtype, bool fp8) {
  // As a TensorList: a std::vector argument would not be taken for tensors (no gradients).
  return SharedInputLinearFunction::apply(x, at::TensorList(weights), dtype, fp8);
}

at::Tensor SwiGluMlp(const at::Tensor& h, const at::Tensor& gate, const at::Tensor& up,
                     const at::Tensor& down, c10::ScalarType dtype, bool recompute_projections,
                     bool fp8) {
  return SwiGluMlpFunction::apply(h, gate, up, down, dtype, recompute_projections, fp8);
}

}  // namespace dflash::drafter

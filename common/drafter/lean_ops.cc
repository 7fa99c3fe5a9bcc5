#include "common/drafter/lean_ops.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <torch/csrc/autograd/custom_function.h>

namespace dflash::drafter {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::ScalarType SavedDtype(AutogradContext* ctx) {
  return static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
}

// dW = dY^T X over every leading dimension, in the compute dtype, returned in `weight_dtype`:
// what autograd computes for linear(x, w.to(dtype)) followed by the cast's backward.
at::Tensor WeightGrad(const at::Tensor& dy, const at::Tensor& x, c10::ScalarType weight_dtype) {
  const at::Tensor dy2 = dy.reshape({-1, dy.size(-1)});
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
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

struct SwiGluMlpFunction : public torch::autograd::Function<SwiGluMlpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& gate,
                            const at::Tensor& up, const at::Tensor& down, c10::ScalarType dtype) {
    at::Tensor g = at::linear(h, gate.to(dtype));
    at::Tensor u = at::linear(h, up.to(dtype));
    at::Tensor out = at::linear(at::silu(g) * u, down.to(dtype));
    ctx->save_for_backward({h, g, u, gate, up, down});
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &g = saved[1], &u = saved[2];
    const at::Tensor &gate = saved[3], &up = saved[4], &down = saved[5];
    const c10::ScalarType dtype = SavedDtype(ctx);
    const at::Tensor& dout = grads[0];
    at::Tensor s = at::silu(g);
    at::Tensor d_down;
    if (ctx->needs_input_grad(3)) d_down = WeightGrad(dout, s * u, down.scalar_type());
    // The product's gradient, then mul's and silu's backward as autograd writes them.
    at::Tensor da = at::matmul(dout, down.to(dtype));
    at::Tensor du = da * s;
    s.reset();
    at::Tensor dg = at::silu_backward(da * u, g);
    da.reset();
    at::Tensor dh, d_gate, d_up;
    if (ctx->needs_input_grad(0))
      dh = at::matmul(dg, gate.to(dtype)) + at::matmul(du, up.to(dtype));
    if (ctx->needs_input_grad(1)) d_gate = WeightGrad(dg, h, gate.scalar_type());
    if (ctx->needs_input_grad(2)) d_up = WeightGrad(du, h, up.scalar_type());
    return {dh, d_gate, d_up, d_down, at::Tensor()};
  }
};

}  // namespace

at::Tensor CastLinear(const at::Tensor& x, const at::Tensor& weight, c10::ScalarType dtype) {
  if (weight.scalar_type() == dtype) return at::linear(x, weight);
  return CastLinearFunction::apply(x, weight, dtype);
}

at::Tensor SwiGluMlp(const at::Tensor& h, const at::Tensor& gate, const at::Tensor& up,
                     const at::Tensor& down, c10::ScalarType dtype) {
  return SwiGluMlpFunction::apply(h, gate, up, down, dtype);
}

}  // namespace dflash::drafter

#include "common/drafter/fp8_linear.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#ifdef DFLASH_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif
#ifdef DFLASH_HAVE_FP8_QUANT
#include "common/kernels/fp8_quant/fp8_quant.h"
#endif

namespace dflash::drafter {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rowwise quantization of t [R, C] along `dim` (1: each row over its columns; 0: each column
// over the rows, for t^T's rows), dividing in t's own dtype (bf16 activations: no fp32 copy of a
// [tokens, width] matrix) by a scale rounded to that dtype, which is then the scale used to
// dequantize. Returns q in t's layout and the scales.
std::pair<at::Tensor, at::Tensor> QuantizeAlong(const at::Tensor& t, int64_t dim) {
  const c10::ScalarType dtype = t.scalar_type();
  // max |t| in one pass (no |t| temporary).
  at::Tensor amax = at::linalg_vector_norm(t, INFINITY, {dim}, false).to(at::kFloat);  // exact
  amax = at::where(amax.gt(0), amax, at::ones_like(amax));
  const at::Tensor scale = (amax / kE4m3Max).to(dtype);
  at::Tensor v = t / (dim == 1 ? scale.unsqueeze(1) : scale.unsqueeze(0));
  // Clamped: a value divided by its row's rounded scale can land a hair above 448, and a cast
  // past e4m3's range gives NaN (e4m3fn has no infinity).
  v.clamp_(-kE4m3Max, kE4m3Max);
  return {v.to(at::kFloat8_e4m3fn), scale.to(at::kFloat).contiguous()};
}

int64_t Padded16(int64_t n) { return (n + 15) / 16 * 16; }

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            c10::ScalarType dtype) {
    const int64_t in = weight.size(1), out = weight.size(0);
    TORCH_CHECK(x.size(-1) == in, "fp8 linear: x has ", x.size(-1), " columns, the weight ", in);
    const at::Tensor x2 = x.reshape({-1, in});
    ctx->save_for_backward({x, weight});
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    at::Tensor y = Fp8Forward(x2, weight, dtype);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t in = weight.size(1), out = weight.size(0);
    const at::Tensor dy = grads[0].reshape({-1, out});
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      // dX = dY W: dY per row (over Out), W per input column (rows of W^T, over Out).
      dx = Fp8InputGrad(dy, weight, dtype).view(x.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      // dW = dY^T X: both per row of their transposes (over the tokens, padded to 16).
      dw = Fp8WeightGrad(dy, x.reshape({-1, in}), dtype).to(weight.scalar_type());
    }
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

Fp8Rows QuantizeRowsE4m3Reference(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2, "fp8 quantization takes a matrix, got ", t.sizes());
  auto [q, scale] = QuantizeAlong(t, 1);
  return {q.contiguous(), scale};
}

Fp8Rows QuantizeColumnsE4m3Reference(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2, "fp8 quantization takes a matrix, got ", t.sizes());
  const int64_t pad = Padded16(t.size(0)) - t.size(0);
  const at::Tensor padded = pad == 0 ? t : at::constant_pad_nd(t, {0, 0, 0, pad}, 0);
  auto [q, scale] = QuantizeAlong(padded, 0);
  // Transposed in e4m3: a quarter of a bf16 transpose's bytes.
  return {q.t().contiguous(), scale};
}

Fp8Rows QuantizeRowsE4m3(const at::Tensor& t) {
#ifdef DFLASH_HAVE_FP8_QUANT
  if (kernels::Fp8QuantKernelTakes(t)) {
    auto [q, scale] = kernels::QuantizeRowsE4m3Cuda(t);
    return {q, scale};
  }
#endif
  return QuantizeRowsE4m3Reference(t);
}

Fp8Rows QuantizeColumnsE4m3(const at::Tensor& t) {
#ifdef DFLASH_HAVE_FP8_QUANT
  if (kernels::Fp8QuantKernelTakes(t)) {
    auto [q, scale] = kernels::QuantizeColumnsE4m3Cuda(t, Padded16(t.size(0)));
    return {q, scale};
  }
#endif
  return QuantizeColumnsE4m3Reference(t);
}

bool Fp8MatmulInHardware(const c10::Device& device) {
#ifdef DFLASH_HAVE_TORCH_CUDA
  if (!device.is_cuda()) return false;
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
  return p->major > 8 || (p->major == 8 && p->minor >= 9);
#else
  (void)device;
  return false;
#endif
}

at::Tensor ScaledMatmulNT(const Fp8Rows& a, const Fp8Rows& b, c10::ScalarType out) {
  TORCH_CHECK(a.q.size(1) == b.q.size(1), "fp8 matmul: ", a.q.sizes(), " x ", b.q.sizes(), "^T");
  if (Fp8MatmulInHardware(a.q.device())) {
    TORCH_CHECK(a.q.size(1) % 16 == 0 && b.q.size(0) % 16 == 0, "fp8 matmul: ", a.q.sizes(), " x ",
                b.q.sizes(),
                "^T: the contraction and the output columns must be multiples "
                "of 16");
    // b.q is row-major [N, K]: its transpose is the column-major [K, N] the kernel takes.
    return at::_scaled_mm(a.q, b.q.t(), a.scale.view({-1, 1}), b.scale.view({1, -1}), std::nullopt,
                          std::nullopt, out, /*use_fast_accum=*/false);
  }
  const at::Tensor da = a.q.to(at::kFloat) * a.scale.unsqueeze(1);
  const at::Tensor db = b.q.to(at::kFloat) * b.scale.unsqueeze(1);
  return at::matmul(da, db.t()).to(out);
}

at::Tensor Fp8Forward(const at::Tensor& x, const at::Tensor& weight, c10::ScalarType out) {
  return ScaledMatmulNT(QuantizeRowsE4m3(x), QuantizeRowsE4m3(weight), out);
}

at::Tensor Fp8InputGrad(const at::Tensor& dy, const at::Tensor& weight, c10::ScalarType out) {
  return ScaledMatmulNT(QuantizeRowsE4m3(dy), QuantizeColumnsE4m3(weight), out);
}

at::Tensor Fp8WeightGrad(const at::Tensor& dy, const at::Tensor& x, c10::ScalarType out) {
  return ScaledMatmulNT(QuantizeColumnsE4m3(dy), QuantizeColumnsE4m3(x), out);
}

at::Tensor Fp8Linear(const at::Tensor& x, const at::Tensor& weight, c10::ScalarType dtype) {
  return Fp8LinearFunction::apply(x, weight, dtype);
}

}  // namespace dflash::drafter

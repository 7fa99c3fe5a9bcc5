// The drafter's linear layers in fp8 (drafter.precision: fp8, docs/method.md §4.1): e4m3 operands
// with one fp32 scale per row of each operand ("rowwise" scaling: scale = max |row| / 448, the
// largest e4m3 value), products accumulated in fp32 and written in bf16. All three GEMMs of a
// linear layer run this way: the forward x W^T, and the backward's dX = dY W and dW = dY^T X, each
// operand quantized along the dimension the product contracts (so W is quantized per output row
// in the forward and per input column in the backward). The fp32 master weights and everything
// outside the GEMMs stay as they are (bf16 activations, fp32 optimizer).
//
// On CUDA devices of compute capability 8.9 or later the products are LibTorch's scaled matmul
// (cuBLASLt fp8); elsewhere the same quantization is emulated (quantize, dequantize, matmul in
// fp32), which is the CPU reference the GPU tests compare with.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace dflash::drafter {

// Largest finite e4m3 value.
inline constexpr double kE4m3Max = 448.0;

// A matrix in e4m3 with one fp32 scale per row: value[r][c] ~= q[r][c] * scale[r].
struct Fp8Rows {
  at::Tensor q;      // [R, C] Float8_e4m3fn, contiguous
  at::Tensor scale;  // [R] fp32, > 0
};

// t [R, C] (any floating dtype) -> its rowwise e4m3 form: scale = max |row| / 448 rounded to t's
// dtype (1 / 448 for a row of zeros), q = e4m3(clamp(t / scale in t's dtype, +-448)). On CUDA
// (bf16, fp32) one kernel (common/kernels/fp8_quant); elsewhere the Reference, LibTorch's
// operators, which the kernel matches bit for bit.
Fp8Rows QuantizeRowsE4m3(const at::Tensor& t);
// The rows of t^T: each column of t quantized over its rows as above, transposed, its row length
// padded with zeros to a multiple of 16 (the scaled matmul's contraction): q [C, R16], scale [C].
Fp8Rows QuantizeColumnsE4m3(const at::Tensor& t);
Fp8Rows QuantizeRowsE4m3Reference(const at::Tensor& t);
Fp8Rows QuantizeColumnsE4m3Reference(const at::Tensor& t);

// a.q [M, K], b.q [N, K] -> (a b^T) [M, N] in `out` (bf16 on CUDA), K a multiple of 16.
at::Tensor ScaledMatmulNT(const Fp8Rows& a, const Fp8Rows& b, c10::ScalarType out);

// Whether `device` runs ScaledMatmulNT in hardware (CUDA, compute capability >= 8.9).
bool Fp8MatmulInHardware(const c10::Device& device);

// The three products of a linear layer, each operand quantized along the dimension its product
// contracts (2-D: x [N, In], dy [N, Out], weight [Out, In]); results in `out`.
at::Tensor Fp8Forward(const at::Tensor& x, const at::Tensor& weight, c10::ScalarType out);  // x W^T
at::Tensor Fp8InputGrad(const at::Tensor& dy, const at::Tensor& weight,
                        c10::ScalarType out);                                              // dY W
at::Tensor Fp8WeightGrad(const at::Tensor& dy, const at::Tensor& x, c10::ScalarType out);  // dY^T X

// x [..., In] in `dtype` (bf16), weight [Out, In] (fp32 master) -> x W^T [..., Out] in `dtype`, the
// three GEMMs in fp8 as above. Differentiable in x and weight (weight's gradient in its dtype).
// In and Out multiples of 16.
at::Tensor Fp8Linear(const at::Tensor& x, const at::Tensor& weight, c10::ScalarType dtype);

}  // namespace dflash::drafter

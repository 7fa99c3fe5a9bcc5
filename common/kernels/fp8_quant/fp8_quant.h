// Rowwise e4m3 quantization on CUDA in one kernel per layout (params.h): what
// drafter::QuantizeRowsE4m3 / QuantizeColumnsE4m3 compute with five LibTorch operators (max |x|,
// divide, round, clamp, cast), in one read of the input (two for columns) and one byte written
// per element. The CPU reference is those functions on the CPU (tests/kernels/
// fp8_quant_gpu_test.cc compares them bit for bit).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace dflash::kernels {

// x [R, C] contiguous bf16 or fp32 on CUDA, R >= 1. Returns {q [R, C] Float8_e4m3fn, scale [R]}.
std::pair<at::Tensor, at::Tensor> QuantizeRowsE4m3Cuda(const at::Tensor& x);

// Each column of x over its rows, transposed: {q [C, padded_rows] (zeros past R), scale [C]};
// padded_rows >= R.
std::pair<at::Tensor, at::Tensor> QuantizeColumnsE4m3Cuda(const at::Tensor& x, int64_t padded_rows);

// Whether x can take the kernels (CUDA, bf16 or fp32, 2-D, at least one row).
bool Fp8QuantKernelTakes(const at::Tensor& x);

}  // namespace dflash::kernels

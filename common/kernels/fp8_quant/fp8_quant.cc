#include "common/kernels/fp8_quant/fp8_quant.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "common/kernels/fp8_quant/params.h"
#include "common/kernels/launch_check.h"

namespace dflash::kernels {
namespace {

Fp8QuantParams ParamsOf(const at::Tensor& x) {
  TORCH_CHECK(Fp8QuantKernelTakes(x),
              "fp8 quantization kernel: x must be a 2-D bf16 or fp32 "
              "CUDA tensor with at least one row, got ",
              x.sizes(), " ", x.scalar_type());
  Fp8QuantParams p;
  p.x = x.data_ptr();
  p.rows = x.size(0);
  p.cols = x.size(1);
  p.dtype = x.scalar_type() == at::kBFloat16 ? Fp8QuantDType::kBFloat16 : Fp8QuantDType::kFloat32;
  return p;
}

}  // namespace

bool Fp8QuantKernelTakes(const at::Tensor& x) {
  return x.is_cuda() && x.dim() == 2 && x.size(0) >= 1 &&
         (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat);
}

std::pair<at::Tensor, at::Tensor> QuantizeRowsE4m3Cuda(const at::Tensor& x_in) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  Fp8QuantParams p = ParamsOf(x);
  at::Tensor q = at::empty({p.rows, p.cols}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({p.rows}, x.options().dtype(at::kFloat));
  p.q = q.data_ptr();
  p.scale = scale.data_ptr<float>();
  CheckLaunch(LaunchFp8Quant(p, at::cuda::getCurrentCUDAStream(x.device().index()).stream()),
              "fp8 row quantization");
  return {q, scale};
}

std::pair<at::Tensor, at::Tensor> QuantizeColumnsE4m3Cuda(const at::Tensor& x_in,
                                                          int64_t padded_rows) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  Fp8QuantParams p = ParamsOf(x);
  TORCH_CHECK(padded_rows >= p.rows, "fp8 column quantization: padded_rows ", padded_rows,
              " < rows ", p.rows);
  at::Tensor q = at::empty({p.cols, padded_rows}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({p.cols}, x.options().dtype(at::kFloat));
  at::Tensor amax = at::zeros({p.cols}, x.options().dtype(at::kInt));
  p.q = q.data_ptr();
  p.scale = scale.data_ptr<float>();
  p.amax = reinterpret_cast<uint32_t*>(amax.data_ptr<int32_t>());
  p.padded_rows = padded_rows;
  p.columns = true;
  CheckLaunch(LaunchFp8Quant(p, at::cuda::getCurrentCUDAStream(x.device().index()).stream()),
              "fp8 column quantization");
  return {q, scale};
}

}  // namespace dflash::kernels

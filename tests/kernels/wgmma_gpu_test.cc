// The wgmma helpers of common/kernels/dflash_attn/wgmma.cuh (swizzled tiles, descriptors, register
// and shared-memory operands, transposed reads) against fp32 matmuls of the same bf16 values: the
// three operand forms of the attention backward. Fresh random values each run. Labelled gpu;
// skipped without a CUDA device of compute capability 9.0.
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "common/device/device_probe.h"
#include "tests/common/max_rel_error.h"
#include "tests/kernels/wgmma_check.h"

namespace dflash::kernels {
namespace {

TEST(WgmmaGpu, SwizzledOperandsInEveryFormMatchMatmul) {
  if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const c10::Device cuda(c10::kCUDA, 0);
  const auto bf16 = at::TensorOptions().device(cuda).dtype(at::kBFloat16);
  const at::Tensor x = at::randn({64, 128}, bf16), y = at::randn({64, 128}, bf16);
  const at::Tensor z = at::randn({64, 64}, bf16);
  const auto f32 = at::TensorOptions().device(cuda).dtype(at::kFloat);
  const at::Tensor c1 = at::empty({64, 64}, f32), c2 = at::empty({64, 128}, f32),
                   c3 = at::empty({64, 128}, f32);
  const int rc =
      testing::RunWgmmaCheck(x.data_ptr(), y.data_ptr(), z.data_ptr(), c1.data_ptr<float>(),
                             c2.data_ptr<float>(), c3.data_ptr<float>());
  if (rc == -1) GTEST_SKIP() << "the device is not compute capability 9.x";
  ASSERT_EQ(rc, 0);
  const at::Tensor xf = x.to(at::kFloat), yf = y.to(at::kFloat), zf = z.to(at::kFloat);
  EXPECT_LT(dflash::testing::MaxRelError(c1, at::matmul(xf, yf.t())), 1e-4) << "x y^T";
  EXPECT_LT(dflash::testing::MaxRelError(c2, at::matmul(zf, yf)), 1e-4) << "z y";
  EXPECT_LT(dflash::testing::MaxRelError(c3, at::matmul(zf.t(), xf)), 1e-4) << "z^T x";
}

}  // namespace
}  // namespace dflash::kernels

// The fp8 quantization kernels (common/kernels/fp8_quant) against their CPU reference
// (drafter::QuantizeRowsE4m3Reference / QuantizeColumnsE4m3Reference, LibTorch's operators on the
// CPU): the same e4m3 bytes and the same scales, bit for bit, for bf16 and fp32 matrices with
// rows of very different magnitudes, a row and a column of zeros, and sizes that are no multiple
// of the kernels' tiles (the columns' padding to 16 rows included), through both column paths (the
// 16-byte one where the columns are a multiple of 8 bf16 / 4 fp32 values, e.g. 1024 x 4096, 200 x
// 136; the element-wise one otherwise, e.g. 37 x 300 bf16, 300 x 33). Labelled gpu; skipped
// without a CUDA device.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/device/device_probe.h"
#include "common/drafter/fp8_linear.h"
#include "common/kernels/fp8_quant/fp8_quant.h"

namespace dflash::kernels {
namespace {

// Bytes of an e4m3 tensor as uint8 (equal bytes: equal values, NaN patterns included).
at::Tensor Bytes(const at::Tensor& q) { return q.cpu().view(at::kByte); }

void ExpectSame(const drafter::Fp8Rows& got, const drafter::Fp8Rows& want,
                const std::string& what) {
  ASSERT_EQ(got.q.sizes(), want.q.sizes()) << what;
  const at::Tensor differ = at::ne(Bytes(got.q), Bytes(want.q));
  EXPECT_EQ(differ.sum().item<int64_t>(), 0) << what << ": e4m3 bytes differ";
  EXPECT_TRUE(at::equal(got.scale.cpu(), want.scale.cpu())) << what << ": scales differ";
}

class Fp8QuantGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(Fp8QuantGpu, RowsAndColumnsMatchTheCpuReferenceBitForBit) {
  at::Generator gen = at::detail::createCPUGenerator(21);
  const c10::Device cuda(c10::kCUDA, 0);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 300},
                                   {1, 16},
                                   {300, 33},
                                   {1024, 4096},
                                   {16, 12288},
                                   {200, 136},
                                   {65, 264}}) {
    for (const c10::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      const std::string what =
          std::to_string(rows) + " x " + std::to_string(cols) + " " + c10::toString(dtype);
      // Row magnitudes from 1e-4 to 1e4, one row and one column of zeros.
      at::Tensor x = at::randn({rows, cols}, gen) *
                     at::pow(10.0, at::randn({rows, 1}, gen) * 2.0).clamp(1e-4, 1e4);
      if (rows > 2) x[1].zero_();
      if (cols > 2) x.select(1, 2).zero_();
      x = x.to(dtype);
      ExpectSame(drafter::QuantizeRowsE4m3(x.to(cuda)), drafter::QuantizeRowsE4m3Reference(x),
                 what + " rows");
      ExpectSame(drafter::QuantizeColumnsE4m3(x.to(cuda)), drafter::QuantizeColumnsE4m3Reference(x),
                 what + " columns");
    }
  }
}

}  // namespace
}  // namespace dflash::kernels

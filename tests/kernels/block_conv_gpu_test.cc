// The fused block convolution on CUDA (common/kernels/block_conv) against LibTorch's composition
// (drafter::BlockConvolution, its CPU path) in fp32 on the CPU from the same inputs: the output
// and the gradients of x, delta and base. Fresh random inputs every run (the seed is printed),
// the kernels' outputs poisoned with NaN first. Labelled gpu; skipped without a CUDA device.
#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "common/device/device_probe.h"
#include "common/drafter/drafter_model.h"
#include "common/kernels/block_conv/block_conv.h"
#include "tests/common/max_rel_error.h"

namespace dflash::kernels {
namespace {

using dflash::testing::MaxRelError;

struct Case {
  int64_t blocks, block, kernel, h, group;
  c10::ScalarType dtype;
  double tol;
  bool strided_delta;  // delta as a view of [rows, 2, K, G], as ConvIn passes it
  c10::ScalarType base_dtype = at::kFloat;
};

void RunCase(const Case& c) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " blocks " << c.blocks << " B " << c.block << " K " << c.kernel
               << " H " << c.h << " group " << c.group << " " << c.dtype);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t rows = c.blocks * c.block, groups = c.h / c.group;
  const at::Tensor x = at::randn({rows, c.h}, gen, at::kFloat);
  const at::Tensor both = at::randn({rows, 2, c.kernel, groups}, gen, at::kFloat) * 0.5;
  const at::Tensor base = at::randn({c.kernel, c.h}, gen, at::kFloat);
  const at::Tensor dy = at::randn({rows, c.h}, gen, at::kFloat);

  // Reference: the composition in fp32 on the CPU from the inputs rounded to the case's dtypes.
  auto leaf = [](const at::Tensor& t) { return t.detach().clone().requires_grad_(true); };
  const at::Tensor x_ref = leaf(x.to(c.dtype).to(at::kFloat));
  const at::Tensor both_ref = leaf(both.to(c.dtype).to(at::kFloat));
  const at::Tensor base_ref = leaf(base.to(c.base_dtype).to(at::kFloat));
  const at::Tensor dy_ref = dy.to(c.dtype).to(at::kFloat);
  const at::Tensor delta_ref = c.strided_delta ? both_ref.select(1, 1) : both_ref.select(1, 1) * 1;
  const at::Tensor out_ref =
      drafter::BlockConvolution(x_ref, delta_ref, base_ref, c.block, c.group);
  (out_ref * dy_ref).sum().backward();

  const c10::Device cuda(c10::kCUDA, 0);
  const at::Tensor x_gpu = x.to(cuda, c.dtype).detach().requires_grad_(true);
  const at::Tensor both_gpu = both.to(cuda, c.dtype).detach().requires_grad_(true);
  const at::Tensor base_gpu = base.to(cuda, c.base_dtype).detach().requires_grad_(true);
  const at::Tensor delta_gpu =
      c.strided_delta ? both_gpu.select(1, 1) : both_gpu.select(1, 1).contiguous();
  ASSERT_TRUE(SupportsFusedBlockConv(x_gpu, delta_gpu, base_gpu, c.block, c.group));
  // Poison: a NaN-filled block freed for the caching allocator to hand to the kernels' outputs.
  { at::full({64 << 20}, std::nan(""), at::TensorOptions().device(cuda)); }
  const at::Tensor out = FusedBlockConvolution(x_gpu, delta_gpu, base_gpu, c.block, c.group);
  EXPECT_EQ(out.scalar_type(), c.dtype);
  EXPECT_FALSE(at::isnan(out).any().item<bool>());
  EXPECT_LT(MaxRelError(out.to(at::kFloat).cpu(), out_ref.detach()), c.tol);
  { at::full({64 << 20}, std::nan(""), at::TensorOptions().device(cuda)); }
  (out.to(at::kFloat) * dy.to(cuda, c.dtype).to(at::kFloat)).sum().backward();
  ASSERT_TRUE(x_gpu.grad().defined() && both_gpu.grad().defined() && base_gpu.grad().defined());
  EXPECT_EQ(base_gpu.grad().scalar_type(), c.base_dtype);
  EXPECT_FALSE(at::isnan(x_gpu.grad()).any().item<bool>());
  EXPECT_FALSE(at::isnan(both_gpu.grad()).any().item<bool>());
  EXPECT_LT(MaxRelError(x_gpu.grad().to(at::kFloat).cpu(), x_ref.grad()), c.tol);
  EXPECT_LT(MaxRelError(both_gpu.grad().to(at::kFloat).cpu(), both_ref.grad()), c.tol);
  EXPECT_LT(MaxRelError(base_gpu.grad().to(at::kFloat).cpu(), base_ref.grad()), c.tol);
  // Side 0 of delta is not used: its gradient is zero on both paths.
  EXPECT_EQ(both_gpu.grad().select(1, 0).abs().max().item<float>(), 0.f);
}

class BlockConvGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(BlockConvGpu, Fp32MatchesTheComposition) {
  RunCase({8, 16, 2, 256, 16, at::kFloat, 1e-5, true});   // DFlash2's auto settings
  RunCase({5, 4, 3, 64, 8, at::kFloat, 1e-5, false});     // more taps, smaller blocks
  RunCase({200, 16, 1, 96, 32, at::kFloat, 1e-5, true});  // one tap; several base tiles
}

TEST_F(BlockConvGpu, Bf16AndFp16MatchTheComposition) {
  RunCase({64, 16, 2, 512, 16, at::kBFloat16, 2e-2, true});
  RunCase({64, 16, 2, 512, 16, at::kBFloat16, 2e-2, true, at::kBFloat16});  // a bf16 base
  RunCase({16, 8, 4, 128, 16, at::kHalf, 1e-2, false});
}

TEST_F(BlockConvGpu, RefusesWhatItCannotTake) {
  const c10::Device cuda(c10::kCUDA, 0);
  const auto on = at::TensorOptions().device(cuda);
  const at::Tensor x = at::zeros({32, 64}, on), delta = at::zeros({32, 2, 4}, on);
  const at::Tensor base = at::zeros({2, 64}, on);
  EXPECT_TRUE(SupportsFusedBlockConv(x, delta, base, 16, 16));
  EXPECT_FALSE(SupportsFusedBlockConv(x.cpu(), delta.cpu(), base.cpu(), 16, 16));
  EXPECT_FALSE(SupportsFusedBlockConv(x, delta, base, 12, 16));  // 32 rows are not blocks of 12
  EXPECT_FALSE(SupportsFusedBlockConv(x, delta, base, 16, 8));   // delta has 4 groups, not 8
  EXPECT_FALSE(SupportsFusedBlockConv(x, delta.to(at::kHalf), base, 16, 16));
  EXPECT_FALSE(SupportsFusedBlockConv(x, delta, at::zeros({20, 64}, on), 16, 16));  // K > B
  EXPECT_THROW(FusedBlockConvolution(x, delta, base, 12, 16), c10::Error);
}

}  // namespace
}  // namespace dflash::kernels

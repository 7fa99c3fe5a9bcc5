// drafter.precision: fp8 on the CPU (common/drafter/fp8_linear.h, the emulation that the GPU tests
// compare the hardware path with): the rowwise e4m3 quantization's error bound, the three GEMMs of
// Fp8Linear against the products of the dequantized operands (each operand quantized along the
// dimension its product contracts), and the model's refusals (the training run against bf16 is in
// tests/train/trainer_test.cc).
#include "common/drafter/fp8_linear.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/drafter/drafter_model.h"
#include "tests/drafter/test_util.h"

namespace dflash::drafter {
namespace {

// max |a - b| / max |b|.
double RelDiff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a32 = a.to(at::kFloat), b32 = b.to(at::kFloat);
  return (a32 - b32).abs().max().item<double>() / std::max(b32.abs().max().item<double>(), 1e-30);
}

at::Tensor Dequantized(const Fp8Rows& r) { return r.q.to(at::kFloat) * r.scale.unsqueeze(1); }

TEST(Fp8Linear, RowwiseE4m3KeepsEachValueWithinItsPrecision) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  // Rows of very different magnitudes, and a row of zeros.
  at::Tensor t =
      at::randn({6, 64}, gen) * at::tensor({1e-3, 1.0, 30.0, 1e4, 0.0, 2.0}).view({6, 1});
  const Fp8Rows r = QuantizeRowsE4m3(t);
  EXPECT_EQ(r.q.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(r.scale.sizes(), at::IntArrayRef({6}));
  const at::Tensor back = Dequantized(r);
  for (int64_t i = 0; i < 6; ++i) {
    const at::Tensor row = t[i], got = back[i];
    const double amax = row.abs().max().item<double>();
    if (amax == 0) {
      EXPECT_EQ(got.abs().max().item<double>(), 0.0) << "a row of zeros stays zero";
      continue;
    }
    EXPECT_NEAR(got.abs().max().item<double>(), amax, amax * 1e-6) << "the row's max is exact";
    // 3 mantissa bits: half an ulp is 1/16 of the value; below e4m3's normal range (2^-6 of the
    // largest, 448) the step is 2^-9 of the row's scale.
    const at::Tensor bound = row.abs() / 16 + (amax / kE4m3Max) * std::pow(2.0, -9);
    EXPECT_TRUE((got - row).abs().le(bound * 1.0001).all().item<bool>()) << "row " << i;
  }
}

TEST(Fp8Linear, ForwardAndGradientsAreTheDequantizedProducts) {
  at::Generator gen = at::detail::createCPUGenerator(6);
  const at::Tensor x = at::randn({3, 7, 32}, gen).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor w = (at::randn({48, 32}, gen) * 0.1).requires_grad_(true);
  const at::Tensor y = Fp8Linear(x, w, at::kBFloat16);
  ASSERT_EQ(y.sizes(), at::IntArrayRef({3, 7, 48}));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const at::Tensor dy = at::randn({3, 7, 48}, gen).to(at::kBFloat16);
  torch::autograd::backward({y}, {dy});

  const at::Tensor x2 = x.detach().reshape({21, 32}), dy2 = dy.reshape({21, 48});
  const at::Tensor want_y =
      at::matmul(Dequantized(QuantizeRowsE4m3(x2)), Dequantized(QuantizeRowsE4m3(w.detach())).t());
  EXPECT_LE(RelDiff(y.reshape({21, 48}), want_y), 1e-2) << "forward (bf16 output)";
  // dX = dY W with W quantized per input column; dW = dY^T X quantized per row of the transposes.
  const at::Tensor want_dx =
      at::matmul(Dequantized(QuantizeRowsE4m3(dy2)),
                 Dequantized(QuantizeRowsE4m3(w.detach().t().contiguous())).t());
  EXPECT_LE(RelDiff(x.grad().reshape({21, 32}), want_dx), 1e-2) << "dX";
  const at::Tensor want_dw = at::matmul(Dequantized(QuantizeRowsE4m3(dy2.t().contiguous())),
                                        Dequantized(QuantizeRowsE4m3(x2.t().contiguous())).t());
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  EXPECT_LE(RelDiff(w.grad(), want_dw), 1e-2) << "dW";

  // And all three within fp8's precision of the exact fp32 products.
  const at::Tensor exact_y = at::linear(x2.to(at::kFloat), w.detach());
  EXPECT_LE(RelDiff(y.reshape({21, 48}), exact_y), 0.1);
  EXPECT_LE(RelDiff(x.grad().reshape({21, 32}), at::matmul(dy2.to(at::kFloat), w.detach())), 0.1);
  EXPECT_LE(RelDiff(w.grad(), at::matmul(dy2.to(at::kFloat).t(), x2.to(at::kFloat))), 0.1);
}

TEST(Fp8Linear, TheModelRefusesWhatFp8CannotRun) {
  const DrafterConfig c = testing::TinyConfig();
  DrafterOptions fp32;
  fp32.fp8 = true;  // compute dtype fp32
  const at::Tensor frozen = at::randn({c.target.vocab_size, c.target.hidden_size});
  auto refused = DrafterModel::Create(c, fp32, frozen, frozen);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("drafter.precision: fp8 needs the bf16 compute dtype"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(Fp8MatmulInHardware(c10::Device(c10::kCPU)));
}

}  // namespace
}  // namespace dflash::drafter

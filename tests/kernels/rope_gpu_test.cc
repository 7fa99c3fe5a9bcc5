// The fused RoPE kernel (common/kernels/rope) against nn::ApplyRope's ATen composition on the CPU
// in fp32, forward and backward: fp32 to float rounding, bf16 and fp16 within one rounding of the
// fp32 result computed from the same rounded inputs. The fused q / k norm and RoPE
// (FusedNormRope) likewise against RmsNorm then ApplyRope, reading q from inside a wider qkv row.
// Labelled gpu; skipped without a CUDA device.
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>

#include "common/device/device_probe.h"
#include "common/kernels/rope/rope.h"
#include "common/nn/layers.h"

namespace dflash::kernels {
namespace {

// Largest |a - b| / (|b| + floor) over the elements.
double Worst(const at::Tensor& a, const at::Tensor& b, double floor) {
  return ((a.to(at::kCPU, at::kFloat) - b).abs() / (b.abs() + floor)).max().item<double>();
}

struct Case {
  int64_t rows, heads, dim;
  c10::ScalarType dtype;
  double tol;  // relative, against the fp32 reference
};

void RunCase(const Case& c) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " [" << c.rows << ", " << c.heads << ", "
                                    << c.dim << "] " << c.dtype);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  // General tables (cos and sin of independent angles per column, not HF's duplicated halves), so
  // that every table column is read where the formula says.
  const at::Tensor angle = at::rand({c.rows, c.dim}, gen, at::kFloat) * 6.3;
  const at::Tensor x = at::randn({c.rows, c.heads, c.dim}, gen, at::kFloat).to(c.dtype);
  const at::Tensor cos = at::cos(angle).to(c.dtype), sin = at::sin(angle).to(c.dtype);
  const at::Tensor dy = at::randn({c.rows, c.heads, c.dim}, gen, at::kFloat).to(c.dtype);

  // Reference: the ATen composition on the CPU in fp32, from the rounded inputs.
  // (detach().clone(): fresh leaves, also when x is already fp32 and .to would return x itself.)
  const at::Tensor x_ref = x.to(at::kFloat).detach().clone().requires_grad_(true);
  const at::Tensor y_ref = nn::ApplyRope(x_ref, {cos.to(at::kFloat), sin.to(at::kFloat)});
  y_ref.backward(dy.to(at::kFloat));

  const c10::Device gpu(c10::kCUDA, 0);
  const at::Tensor xg = x.to(gpu).detach().clone().requires_grad_(true);
  const at::Tensor cg = cos.to(gpu), sg = sin.to(gpu);
  ASSERT_TRUE(SupportsFusedRope(xg, cg, sg));
  const at::Tensor y = FusedRope(xg, cg, sg);
  y.backward(dy.to(gpu));
  // The floor keeps near-zero outputs (cancellation) from dominating: inputs are O(1).
  EXPECT_LE(Worst(y, y_ref.detach(), 1e-1), c.tol);
  EXPECT_LE(Worst(xg.grad(), x_ref.grad(), 1e-1), c.tol);
  // For the record: LibTorch's composition in the case's dtype on the GPU (DFLASH_FUSED_ROPE=0's
  // path) rounds after each operation.
  const at::Tensor xa = x.to(gpu).detach().clone().requires_grad_(true);
  const at::Tensor rotated =
      at::cat({xa.narrow(-1, c.dim / 2, c.dim / 2).neg(), xa.narrow(-1, 0, c.dim / 2)}, -1);
  const at::Tensor ya = xa * cg.unsqueeze(1) + rotated * sg.unsqueeze(1);
  ya.backward(dy.to(gpu));
  std::printf(
      "[%lld, %lld, %lld] %s: worst relative error, fused %.3g / %.3g (out / dx), ATen "
      "composition %.3g / %.3g\n",
      static_cast<long long>(c.rows), static_cast<long long>(c.heads),
      static_cast<long long>(c.dim), c10::toString(c.dtype), Worst(y, y_ref.detach(), 1e-1),
      Worst(xg.grad(), x_ref.grad(), 1e-1), Worst(ya, y_ref.detach(), 1e-1),
      Worst(xa.grad(), x_ref.grad(), 1e-1));
  // And through nn::ApplyRope, which takes the kernel on CUDA: the same values.
  const at::Tensor via_nn = nn::ApplyRope(xg.detach(), {cg, sg});
  EXPECT_TRUE(via_nn.equal(y.detach()));
}

class RopeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(RopeGpu, MatchesTheAtenCompositionForwardAndBackward) {
  for (int64_t dim : {64, 128, 256}) {
    RunCase({37, 5, dim, at::kFloat, 1e-5});
    // One rounding of a value < 2 in magnitude: 2^-9 relative, plus the inputs' exact products.
    RunCase({37, 5, dim, at::kBFloat16, 1.0 / 128});
    RunCase({37, 5, dim, at::kHalf, 1.0 / 1024});
  }
  RunCase({4096, 8, 128, at::kBFloat16, 1.0 / 128});  // more pairs than one grid-stride pass
}

TEST_F(RopeGpu, DeclinesWhatItDoesNotTake) {
  const c10::Device gpu(c10::kCUDA, 0);
  const at::TensorOptions bf16 = at::TensorOptions().dtype(at::kBFloat16).device(gpu);
  const at::Tensor x = at::randn({8, 2, 64}, bf16), t = at::randn({8, 64}, bf16);
  EXPECT_TRUE(SupportsFusedRope(x, t, t));
  EXPECT_FALSE(SupportsFusedRope(x.cpu(), t.cpu(), t.cpu()));                  // not on CUDA
  EXPECT_FALSE(SupportsFusedRope(x, t.narrow(1, 0, 32), t.narrow(1, 0, 32)));  // partial rotary
  EXPECT_FALSE(SupportsFusedRope(x, t.to(at::kFloat), t.to(at::kFloat)));      // table dtype
  EXPECT_FALSE(SupportsFusedRope(at::randn({8, 2, 63}, bf16), at::randn({8, 63}, bf16),
                                 at::randn({8, 63}, bf16)));                 // odd head dim
  EXPECT_FALSE(SupportsFusedRope(x, t.narrow(0, 0, 4), t.narrow(0, 0, 4)));  // rows
}

// q [rows, heads, dim] taken from the middle of a wider [rows, heads * dim + 96] buffer (as from
// the fused qkv product), normed per head with `weight` and rotated, against the fp32 composition
// on the CPU from the same rounded inputs (the norm's output rounded to the dtype, as at::rms_norm
// hands it to RoPE), and the two ops on the GPU (DFLASH_FUSED_QK_NORM_ROPE=0's path) likewise.
void RunNormRopeCase(const Case& c) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " [" << c.rows << ", " << c.heads << ", "
                                    << c.dim << "] " << c.dtype);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double eps = 1e-6;
  const int64_t width = c.heads * c.dim + 96;
  const at::Tensor buffer = (at::randn({c.rows, width}, gen, at::kFloat) * 3.0).to(c.dtype);
  const at::Tensor x = buffer.narrow(1, 64, c.heads * c.dim).view({c.rows, c.heads, c.dim});
  const at::Tensor weight = (at::rand({c.dim}, gen, at::kFloat) + 0.5).to(c.dtype);
  const at::Tensor angle = at::rand({c.rows, c.dim}, gen, at::kFloat) * 6.3;
  const at::Tensor cos = at::cos(angle).to(c.dtype), sin = at::sin(angle).to(c.dtype);

  const at::Tensor normed =
      nn::RmsNorm(x.to(at::kFloat), weight.to(at::kFloat), eps).to(c.dtype).to(at::kFloat);
  const at::Tensor ref = nn::ApplyRope(normed, {cos.to(at::kFloat), sin.to(at::kFloat)});

  const c10::Device gpu(c10::kCUDA, 0);
  const at::Tensor bg = buffer.to(gpu);
  const at::Tensor xg = bg.narrow(1, 64, c.heads * c.dim).view({c.rows, c.heads, c.dim});
  const at::Tensor wg = weight.to(gpu), cg = cos.to(gpu), sg = sin.to(gpu);
  c10::InferenceMode inference;
  ASSERT_TRUE(SupportsFusedNormRope(xg, wg, cg, sg));
  const at::Tensor y = FusedNormRope(xg, wg, eps, cg, sg);
  ASSERT_TRUE(y.is_contiguous());
  EXPECT_LE(Worst(y, ref, 1.0), c.tol);
  const at::Tensor two_ops =
      kernels::FusedRope(nn::RmsNorm(xg, wg, eps).contiguous(), cg, sg);  // at::rms_norm, RoPE
  EXPECT_LE(Worst(two_ops, ref, 1.0), c.tol);
  std::printf("norm+rope [%lld, %lld, %lld] %s: worst relative error, fused %.3g, two ops %.3g\n",
              static_cast<long long>(c.rows), static_cast<long long>(c.heads),
              static_cast<long long>(c.dim), c10::toString(c.dtype), Worst(y, ref, 1.0),
              Worst(two_ops, ref, 1.0));
  // nn::NormRope takes the kernel on CUDA outside autograd: the same values.
  EXPECT_TRUE(nn::NormRope(xg, wg, eps, {cg, sg}).equal(y));
}

TEST_F(RopeGpu, NormRopeMatchesRmsNormThenRope) {
  for (int64_t dim : {64, 128, 256}) {
    RunNormRopeCase({37, 5, dim, at::kFloat, 1e-5});
    // Errors against a floor of 1 (the normed values are O(1), up to about 5): the norm's output
    // may round one unit apart where its fp32 value sits on a boundary (the sum of squares in
    // another order), 2^-8 of up to about 5 in bf16 through cos and sin, plus the output's own
    // rounding; 2^-11 in fp16.
    RunNormRopeCase({37, 5, dim, at::kBFloat16, 1.0 / 20});
    RunNormRopeCase({37, 5, dim, at::kHalf, 1.0 / 160});
  }
  RunNormRopeCase({8192, 32, 128, at::kBFloat16, 1.0 / 20});  // Qwen3-8B's q, 8192 tokens
}

TEST_F(RopeGpu, NormRopeDeclinesWhatItDoesNotTake) {
  const c10::Device gpu(c10::kCUDA, 0);
  const at::TensorOptions bf16 = at::TensorOptions().dtype(at::kBFloat16).device(gpu);
  const at::Tensor x = at::randn({8, 2, 64}, bf16), w = at::randn({64}, bf16);
  const at::Tensor t = at::randn({8, 64}, bf16);
  {
    c10::InferenceMode inference;
    EXPECT_TRUE(SupportsFusedNormRope(x, w, t, t));
    EXPECT_FALSE(SupportsFusedNormRope(x.cpu(), w.cpu(), t.cpu(), t.cpu()));  // not on CUDA
    EXPECT_FALSE(SupportsFusedNormRope(x, w.to(at::kFloat), t, t));           // weight dtype
    EXPECT_FALSE(SupportsFusedNormRope(x, w, t.narrow(1, 0, 32), t.narrow(1, 0, 32)));  // partial
    EXPECT_FALSE(SupportsFusedNormRope(at::randn({8, 2, 96}, bf16), at::randn({96}, bf16),
                                       at::randn({8, 96}, bf16), at::randn({8, 96}, bf16)));
    EXPECT_FALSE(SupportsFusedNormRope(x.transpose(0, 1).contiguous().transpose(0, 1), w, t,
                                       t));  // heads not D apart
  }
  // In grad mode, a tensor that requires grad: the kernel has no backward.
  const at::Tensor xr = x.detach().clone().requires_grad_(true);
  EXPECT_FALSE(SupportsFusedNormRope(xr, w, t, t));
}

}  // namespace
}  // namespace dflash::kernels

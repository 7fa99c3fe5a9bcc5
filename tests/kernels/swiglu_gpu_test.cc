// The fused SwiGLU kernels (common/kernels/swiglu) against LibTorch's composition silu(g) * u on
// the CPU in fp32 with autograd's gradients: fp32 to float rounding, bf16 and fp16 within one
// rounding of the fp32 result computed from the same rounded inputs; the 16-byte path and the
// one-element path (odd sizes, misaligned views); the form over one product's two column halves
// (the target's MLP); and the drafter's MLP (SwiGluMlp, which calls
// them on CUDA) against the same MLP on the CPU. Labelled gpu; skipped without a CUDA device.
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/device/device_probe.h"
#include "common/drafter/lean_ops.h"
#include "common/kernels/swiglu/swiglu.h"

namespace dflash::kernels {
namespace {

// Largest |a - b| / (|b| + floor) over the elements.
double Worst(const at::Tensor& a, const at::Tensor& b, double floor) {
  return ((a.to(at::kCPU, at::kFloat) - b).abs() / (b.abs() + floor)).max().item<double>();
}

struct Case {
  int64_t rows, cols;
  c10::ScalarType dtype;
  double tol;          // relative, against the fp32 reference
  int64_t offset = 0;  // elements skipped at the start of each buffer (misaligned views)
};

void RunCase(const Case& c) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " [" << c.rows << ", " << c.cols << "] "
                                    << c.dtype << " offset " << c.offset);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t n = c.rows * c.cols;
  // Gate values over silu's interesting range (negative tail, the bend, the linear part).
  const at::Tensor g = (at::randn({n + c.offset}, gen, at::kFloat) * 4).to(c.dtype);
  const at::Tensor u = at::randn({n + c.offset}, gen, at::kFloat).to(c.dtype);
  const at::Tensor da = at::randn({n + c.offset}, gen, at::kFloat).to(c.dtype);
  auto view = [&](const at::Tensor& t) { return t.narrow(0, c.offset, n).view({c.rows, c.cols}); };

  // Reference: the composition on the CPU in fp32 from the rounded inputs, autograd's gradients.
  const at::Tensor g_ref = view(g).to(at::kFloat).detach().clone().requires_grad_(true);
  const at::Tensor u_ref = view(u).to(at::kFloat).detach().clone().requires_grad_(true);
  const at::Tensor y_ref = at::silu(g_ref) * u_ref;
  y_ref.backward(view(da).to(at::kFloat));

  const c10::Device gpu(c10::kCUDA, 0);
  const at::Tensor gg = view(g.to(gpu)), ug = view(u.to(gpu));
  ASSERT_TRUE(SupportsFusedSwiGlu(gg, ug));
  const at::Tensor y = FusedSwiGlu(gg, ug);
  const at::Tensor dag = view(da.to(gpu));
  const at::Tensor da_storage = dag.contiguous();  // written over: dg
  auto [dg, du] = FusedSwiGluBackward(da_storage, gg, ug);
  EXPECT_EQ(dg.data_ptr(), da_storage.data_ptr()) << "dg is written over da";
  // The floor keeps near-zero results (silu's negative tail) from dominating: inputs are O(1).
  const double fwd = Worst(y, y_ref.detach(), 1e-1), dgw = Worst(dg, g_ref.grad(), 1e-1),
               duw = Worst(du, u_ref.grad(), 1e-1);
  EXPECT_LE(fwd, c.tol);
  EXPECT_LE(dgw, c.tol);
  EXPECT_LE(duw, c.tol);
  std::printf(
      "[%lld, %lld] %s offset %lld: worst relative error out / dg / du %.3g / %.3g / %.3g\n",
      static_cast<long long>(c.rows), static_cast<long long>(c.cols), c10::toString(c.dtype),
      static_cast<long long>(c.offset), fwd, dgw, duw);
}

class SwiGluGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(SwiGluGpu, MatchesTheCompositionForwardAndBackward) {
  // fp32: __expf's few ulps; bf16 / fp16: one rounding (2^-8 / 2^-11 relative) plus those.
  for (const auto& [dtype, tol] : {std::pair{at::kFloat, 1e-5}, std::pair{at::kBFloat16, 1.0 / 128},
                                   std::pair{at::kHalf, 1.0 / 1024}}) {
    RunCase({64, 256, dtype, tol});     // the 16-byte path
    RunCase({37, 129, dtype, tol});     // n not a multiple of the vector: one element a thread
    RunCase({16, 128, dtype, tol, 3});  // misaligned views: one element a thread
  }
  RunCase({4096, 12288, at::kBFloat16, 1.0 / 128});  // the Qwen3-8B drafter's [N, I]: grid-stride
}

TEST_F(SwiGluGpu, DeclinesWhatItDoesNotTake) {
  const c10::Device gpu(c10::kCUDA, 0);
  const at::TensorOptions bf16 = at::TensorOptions().dtype(at::kBFloat16).device(gpu);
  const at::Tensor g = at::randn({8, 64}, bf16);
  EXPECT_TRUE(SupportsFusedSwiGlu(g, g));
  EXPECT_FALSE(SupportsFusedSwiGlu(g.cpu(), g.cpu()));                      // not on CUDA
  EXPECT_FALSE(SupportsFusedSwiGlu(g, g.to(at::kFloat)));                   // mixed dtypes
  EXPECT_FALSE(SupportsFusedSwiGlu(g, g.narrow(1, 0, 32)));                 // shapes
  EXPECT_FALSE(SupportsFusedSwiGlu(g.to(at::kDouble), g.to(at::kDouble)));  // fp64
}

// The target's form (common/nn/target_model.cc): silu over the first column half of one [N, 2I]
// product times its second half, read in place, against the composition on the CPU in fp32 from
// the same rounded values; the 16-byte path (I a multiple of the vector), the one-element path
// (I odd), the Qwen3-8B target's [8192, 2 x 12288]; and what it declines.
void RunHalvesCase(int64_t rows, int64_t inter, c10::ScalarType dtype, double tol) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " [" << rows << ", 2 x " << inter << "] " << dtype);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Tensor gate_up = (at::randn({rows, 2 * inter}, gen, at::kFloat) * 4).to(dtype);
  const at::Tensor ref = at::silu(gate_up.narrow(1, 0, inter).to(at::kFloat)) *
                         gate_up.narrow(1, inter, inter).to(at::kFloat);
  const at::Tensor on_gpu = gate_up.to(c10::Device(c10::kCUDA, 0));
  ASSERT_TRUE(SupportsFusedSwiGluHalves(on_gpu));
  const at::Tensor y = FusedSwiGluHalves(on_gpu);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{rows, inter}));
  ASSERT_TRUE(y.is_contiguous());
  const double worst = Worst(y, ref, 1e-1);
  EXPECT_LE(worst, tol);
  std::printf("halves [%lld, 2 x %lld] %s: worst relative error %.3g\n",
              static_cast<long long>(rows), static_cast<long long>(inter), c10::toString(dtype),
              worst);
}

TEST_F(SwiGluGpu, TheHalvesOfOneProductMatchTheComposition) {
  for (const auto& [dtype, tol] : {std::pair{at::kFloat, 1e-5}, std::pair{at::kBFloat16, 1.0 / 128},
                                   std::pair{at::kHalf, 1.0 / 1024}}) {
    RunHalvesCase(64, 256, dtype, tol);  // the 16-byte path
    RunHalvesCase(37, 129, dtype, tol);  // I odd: one element a thread
    RunHalvesCase(1, 64, dtype, tol);    // one row (a decoding step)
  }
  RunHalvesCase(8192, 12288, at::kBFloat16, 1.0 / 128);  // the Qwen3-8B target: grid-stride
  const at::TensorOptions bf16 =
      at::TensorOptions().dtype(at::kBFloat16).device(c10::Device(c10::kCUDA, 0));
  const at::Tensor gu = at::randn({8, 128}, bf16);
  EXPECT_FALSE(SupportsFusedSwiGluHalves(gu.cpu()));              // not on CUDA
  EXPECT_FALSE(SupportsFusedSwiGluHalves(gu.narrow(1, 0, 127)));  // odd width
  EXPECT_FALSE(SupportsFusedSwiGluHalves(gu.narrow(1, 0, 64)));   // not row-major [N, 2I]
  EXPECT_FALSE(SupportsFusedSwiGluHalves(gu.t()));                // transposed
  EXPECT_FALSE(SupportsFusedSwiGluHalves(gu.to(at::kDouble)));    // fp64
}

// The drafter's MLP on the GPU in bf16 (its SwiGLU through the kernels) against the same MLP on
// the CPU in fp32 (the composition), output and the three weight gradients and the input's:
// bf16 GEMMs and activations, so a bf16-level bound (norm-relative).
TEST_F(SwiGluGpu, TheDrafterMlpMatchesItsCpuRun) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t n = 96, h = 128, i = 352;
  const at::Tensor x = at::randn({n, h}, gen, at::kFloat);
  const at::Tensor gate = at::randn({i, h}, gen, at::kFloat) * 0.1;
  const at::Tensor up = at::randn({i, h}, gen, at::kFloat) * 0.1;
  const at::Tensor down = at::randn({h, i}, gen, at::kFloat) * 0.1;
  const at::Tensor dy = at::randn({n, h}, gen, at::kFloat);
  auto run = [&](c10::Device device, c10::ScalarType dtype, bool recompute) {
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& t : {x, gate, up, down}) {
      leaves.push_back(t.to(device).detach().clone().requires_grad_(true));
    }
    const at::Tensor y = drafter::SwiGluMlp(leaves[0].to(dtype), leaves[1], leaves[2], leaves[3],
                                            dtype, recompute, /*fp8=*/false);
    y.backward(dy.to(device, dtype));
    std::vector<at::Tensor> out = {y.detach().to(at::kCPU, at::kFloat)};
    for (const at::Tensor& l : leaves) out.push_back(l.grad().to(at::kCPU, at::kFloat));
    return out;
  };
  const auto ref = run(c10::Device(c10::kCPU), at::kFloat, false);
  for (bool recompute : {false, true}) {
    const auto got = run(c10::Device(c10::kCUDA, 0), at::kBFloat16, recompute);
    const char* names[] = {"out", "dx", "d_gate", "d_up", "d_down"};
    for (size_t k = 0; k < ref.size(); ++k) {
      const double rel = ((got[k] - ref[k]).norm() / ref[k].norm()).item<double>();
      EXPECT_LT(rel, 2e-2) << names[k] << (recompute ? " (recompute)" : "");
    }
  }
}

}  // namespace
}  // namespace dflash::kernels

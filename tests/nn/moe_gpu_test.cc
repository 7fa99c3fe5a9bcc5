// The grouped-GEMM path of the Qwen3-MoE MLP on CUDA (bf16: two _grouped_mm launches) against the
// per-expert loop on the same GPU and against an fp32 CPU run of the loop: fresh random inputs
// each run, experts that receive no token included. Skipped without a CUDA device.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "common/nn/moe.h"

namespace dflash::nn {
namespace {

double RelError(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.to(at::kCPU, at::kFloat), w = want.to(at::kCPU, at::kFloat);
  return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
}

TEST(MoeGpuTest, GroupedGemmMatchesThePerExpertLoop) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const int64_t t = 777, h = 256, inter = 96, experts = 16;
  auto make = [&](const at::TensorOptions& o) {
    const auto f32 = o.dtype(at::kFloat);
    MoeWeights w;
    w.router = (at::randn({experts, h}, f32) / std::sqrt(static_cast<double>(h)));
    // Expert 3 never wins: its router row is far below the others.
    w.router[3].fill_(-10.0);
    w.gate_up = at::randn({experts, 2 * inter, h}, f32) / std::sqrt(static_cast<double>(h));
    w.down = at::randn({experts, h, inter}, f32) / std::sqrt(static_cast<double>(inter));
    w.top_k = 4;
    w.norm_topk_prob = true;
    return w;
  };
  const MoeWeights cpu = make(at::TensorOptions());
  MoeWeights gpu = cpu;
  gpu.router = cpu.router.to(at::kCUDA, at::kBFloat16);
  gpu.gate_up = cpu.gate_up.to(at::kCUDA, at::kBFloat16);
  gpu.down = cpu.down.to(at::kCUDA, at::kBFloat16);
  const at::Tensor x = at::randn({t, h});
  const at::Tensor x_gpu = x.to(at::kCUDA, at::kBFloat16);
  at::Tensor grouped = MoeMlp(x_gpu, gpu, /*grouped_gemm=*/true);
  const at::Tensor loop = MoeMlp(x_gpu, gpu, /*grouped_gemm=*/false);
  // The reference takes the bf16-rounded inputs, so that routing sees the same numbers.
  MoeWeights rounded = cpu;
  rounded.router = gpu.router.to(at::kCPU, at::kFloat);
  rounded.gate_up = gpu.gate_up.to(at::kCPU, at::kFloat);
  rounded.down = gpu.down.to(at::kCPU, at::kFloat);
  const at::Tensor reference = MoeMlp(x_gpu.to(at::kCPU, at::kFloat), rounded);
  ASSERT_EQ(grouped.sizes(), x_gpu.sizes());
  EXPECT_TRUE(at::isfinite(grouped).all().item<bool>());
  const double vs_loop = RelError(grouped, loop);
  std::printf("grouped vs loop %.3g, grouped vs fp32 CPU %.3g, loop vs fp32 CPU %.3g\n", vs_loop,
              RelError(grouped, reference), RelError(loop, reference));
  // Same routing on the same GPU: the grouped GEMMs and the loop differ by bf16 rounding only.
  EXPECT_LT(vs_loop, 2e-2);
  // Against fp32 on the CPU a token whose k-th and (k+1)-th router probabilities nearly tie may
  // choose another expert (the logits are rounded differently); every other token agrees.
  at::Tensor g = grouped.to(at::kCPU, at::kFloat);
  at::Tensor row_err = (g - reference).abs().amax(1) / reference.abs().amax();
  const double agree = (row_err < 2e-2).to(at::kFloat).mean().item<double>();
  std::printf("tokens within 2e-2 of fp32 CPU: %.4f\n", agree);
  EXPECT_GT(agree, 0.95);
}

}  // namespace
}  // namespace dflash::nn

// The target's packed causal attention on one GPU: the project's fused
// kernel (FusedCausalVarlenAttention, common/kernels/dflash_attn) against LibTorch's
// flash-attention varlen op (nn::VarlenCausalAttention, what the target model runs), same inputs,
// same run, with the largest difference between the two outputs.
//   causal_attn [--tokens 8192] [--hq 32] [--hkv 8] [--head-dim 128] [--iters 20] [--seed 1]
// Three document mixes: 100-2000 tokens, 64 x 128 tokens, one document of all the tokens.
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "common/kernels/dflash_attn/dflash_attn.h"
#include "common/nn/attention.h"
#include "scripts/bench/bench_flags.h"

namespace {

using dflash::bench::Flag;

double MedianMs(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  c10::cuda::device_synchronize();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    c10::cuda::device_synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv, {"--head-dim", "--hkv", "--hq", "--iters", "--seed", "--tokens"}, "causal_attn");
  const int64_t t = Flag(argc, argv, "--tokens", 8192), hq = Flag(argc, argv, "--hq", 32);
  const int64_t hkv = Flag(argc, argv, "--hkv", 8), d = Flag(argc, argv, "--head-dim", 128);
  const int iters = static_cast<int>(Flag(argc, argv, "--iters", 20));
  std::mt19937_64 rng(static_cast<uint64_t>(Flag(argc, argv, "--seed", 1)));
  if (c10::cuda::device_count() == 0) {
    std::fprintf(stderr, "causal_attn: no CUDA device\n");
    return 1;
  }
  const c10::Device cuda(c10::kCUDA, 0);
  const auto opts = at::TensorOptions().device(cuda).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({t, hq, d}, opts), k = at::randn({t, hkv, d}, opts),
                   v = at::randn({t, hkv, d}, opts);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::printf("tokens %lld, heads %lld/%lld, head_dim %lld, bf16, median of %d\n",
              static_cast<long long>(t), static_cast<long long>(hq), static_cast<long long>(hkv),
              static_cast<long long>(d), iters);
  std::printf("| %-16s | %5s | %12s | %12s | %9s | %10s | %9s |\n", "documents", "docs", "flash ms",
              "fused ms", "speed-up", "fused TF/s", "max diff");
  struct Mix {
    const char* name;
    std::vector<int64_t> cu;
  };
  std::vector<Mix> mixes(3);
  mixes[0].name = "100-2000 tokens";
  mixes[0].cu = {0};
  while (mixes[0].cu.back() < t) {
    const int64_t len = std::uniform_int_distribution<int64_t>(100, 2000)(rng);
    mixes[0].cu.push_back(std::min(t, mixes[0].cu.back() + len));
  }
  mixes[1].name = "128 tokens each";
  for (int64_t x = 0; x <= t; x += 128) mixes[1].cu.push_back(x);
  if (mixes[1].cu.back() != t) mixes[1].cu.push_back(t);
  mixes[2].name = "one document";
  mixes[2].cu = {0, t};
  for (const Mix& m : mixes) {
    std::vector<int32_t> cu32(m.cu.begin(), m.cu.end());
    const at::Tensor cu_dev =
        at::tensor(at::ArrayRef<int32_t>(cu32), at::TensorOptions().dtype(at::kInt)).to(cuda);
    const at::Tensor cu_host =
        at::tensor(at::ArrayRef<int64_t>(m.cu), at::TensorOptions().dtype(at::kLong));
    const dflash::nn::VarlenDocs docs = dflash::nn::VarlenDocs::FromCuSeqlens(cu_dev, cuda);
    double work = 0;  // visible (query, key) pairs
    for (size_t i = 0; i + 1 < m.cu.size(); ++i) {
      const double n = static_cast<double>(m.cu[i + 1] - m.cu[i]);
      work += n * (n + 1) / 2;
    }
    const double tflop = 4.0 * d * hq * work / 1e12;
    at::Tensor a, b;
    const double flash_ms =
        MedianMs([&] { a = dflash::nn::VarlenCausalAttention(q, k, v, docs, scale); }, iters);
    const double fused_ms = MedianMs(
        [&] { b = dflash::kernels::FusedCausalVarlenAttention(q, k, v, cu_host, scale); }, iters);
    const double diff = (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
    std::printf("| %-16s | %5zu | %12.3f | %12.3f | %8.2fx | %10.1f | %9.4f |\n", m.name,
                m.cu.size() - 1, flash_ms, fused_ms, flash_ms / fused_ms, tflop / fused_ms * 1e3,
                diff);
  }
  return 0;
}

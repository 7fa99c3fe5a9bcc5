// Time and peak memory of the drafter's loss at the Qwen3-8B drafter geometry on one GPU: the fused
// lm_head + weighted cross-entropy (common/kernels/fused_ce) against the bare lm_head GEMMs over
// the same rows and the recomputing chunked path (common/drafter/weighted_ce.h), in one run.
//   fused_ce [--rows 8192] [--hidden 4096] [--vocab 151936] [--iters 10]
// Every figure is forward + backward (the loss is always back-propagated) except "bare lm_head
// forward", the single GEMM hidden @ lm_head^T. Peak extra memory: the CUDA caching allocator's
// peak minus what was allocated before the call (inputs and weights).
#include "common/kernels/fused_ce/fused_ce.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "common/drafter/weighted_ce.h"
#include "scripts/bench/bench_flags.h"

namespace {

using dflash::bench::Flag;

size_t Allocated() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
}
size_t Peak() { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak; }

struct Measure {
  double ms;
  double peak_extra_gib;
};

// Mean wall time of `fn` over `iters` runs after two warm-ups, each followed by a synchronize.
Measure Time(const std::function<void()>& fn, int iters) {
  fn();
  fn();
  c10::cuda::device_synchronize();
  const size_t base = Allocated();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  c10::cuda::device_synchronize();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      iters;
  return {ms, static_cast<double>(Peak() - base) / (1 << 30)};
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(argc, argv, {"--hidden", "--iters", "--rows", "--vocab"},
                                   "fused_ce");
  const int64_t rows = Flag(argc, argv, "--rows", 8192),
                hidden = Flag(argc, argv, "--hidden", 4096);
  const int64_t vocab = Flag(argc, argv, "--vocab", 151936);
  const int iters = static_cast<int>(Flag(argc, argv, "--iters", 10));
  if (c10::cuda::device_count() == 0) {
    std::fprintf(stderr, "fused_ce: no CUDA device\n");
    return 1;
  }
  const auto opts = at::TensorOptions().device(c10::Device(c10::kCUDA, 0));
  const at::Tensor h = at::randn({rows, hidden}, opts.dtype(at::kBFloat16)).requires_grad_(true);
  const at::Tensor w = (at::randn({vocab, hidden}, opts.dtype(at::kBFloat16)) * 0.02);
  const at::Tensor labels = at::randint(0, vocab, {rows}, opts.dtype(at::kLong));
  const at::Tensor weights = at::rand({rows}, opts.dtype(at::kFloat));
  const double gemm_tflop = 2.0 * rows * hidden * vocab / 1e12;

  std::printf("rows %lld, hidden %lld, vocab %lld, bf16, %d iterations\n",
              static_cast<long long>(rows), static_cast<long long>(hidden),
              static_cast<long long>(vocab), iters);
  std::printf(
      "| path | chunk rows | ms | TFLOP/s (GEMMs) | peak extra GiB | one logits chunk GiB |\n");
  std::printf("|---|---|---|---|---|---|\n");
  const Measure fwd = Time([&] { at::matmul(h.detach(), w.t()); }, iters);
  std::printf("| bare lm_head forward (1 GEMM) | %lld | %.2f | %.0f | %.3f | - |\n",
              static_cast<long long>(rows), fwd.ms, gemm_tflop / fwd.ms * 1e3, fwd.peak_extra_gib);
  const Measure two = Time(
      [&] {
        at::Tensor logits = at::matmul(h.detach(), w.t());
        at::matmul(logits, w);
      },
      iters);
  std::printf("| bare lm_head forward + dHidden (2 GEMMs) | %lld | %.2f | %.0f | %.3f | - |\n",
              static_cast<long long>(rows), two.ms, 2 * gemm_tflop / two.ms * 1e3,
              two.peak_extra_gib);
  for (int64_t chunk : {1024, 2048, 4096}) {
    const double chunk_gib = static_cast<double>(chunk) * vocab * 2 / (1 << 30);
    const Measure fused = Time(
        [&] {
          auto r = dflash::kernels::FusedWeightedCrossEntropy(h, w, labels, weights, chunk);
          r.numerator.backward();
          h.mutable_grad() = at::Tensor();
        },
        iters);
    std::printf("| fused (this) | %lld | %.2f | %.0f | %.3f | %.3f |\n",
                static_cast<long long>(chunk), fused.ms, 2 * gemm_tflop / fused.ms * 1e3,
                fused.peak_extra_gib, chunk_gib);
    const Measure chunked = Time(
        [&] {
          auto r = dflash::drafter::ChunkedWeightedCrossEntropy(h, w, labels, weights, chunk);
          r.numerator.backward();
          h.mutable_grad() = at::Tensor();
        },
        iters);
    std::printf("| chunked reference (3 GEMMs, fp32 logits) | %lld | %.2f | %.0f | %.3f | %.3f |\n",
                static_cast<long long>(chunk), chunked.ms, 3 * gemm_tflop / chunked.ms * 1e3,
                chunked.peak_extra_gib, chunk_gib);
    if (chunk == 2048) {
      std::printf("ratio fused/bare-forward %.2f, fused/bare-forward+dHidden %.2f (chunk 2048)\n",
                  fused.ms / fwd.ms, fused.ms / two.ms);
    }
  }
  return 0;
}

// Fused DFlash attention (common/kernels/dflash_attn) at the Qwen3-8B drafter geometry on one GPU:
// forward and backward time, TFLOP/s counting only unmasked work, and peak extra memory.
//   dflash_attn [--context 8192] [--anchors 512] [--block 16] [--hq 32] [--hkv 8] [--head-dim 128]
//               [--doc-min 200] [--doc-max 2000] [--iters 20] [--seed 1] [--mask-out FILE]
//               [--json FILE] [--window W] [--reference 1]
// --window W times a sliding-window layer (causal inside the block, context keys within W
// positions; W = 0: causal block, whole context); without it, a full-attention layer. --reference 1
// also times the unfused reference (drafter::ReferenceDrafterAttention on the GPU, what a sliding
// layer ran before the kernels took windows).
// --mask-out writes the generated mask (documents and anchors) for dflash_attn_flex.py, which times
// PyTorch FlexAttention on the same mask in the same run (scripts/bench/dflash_attn.sh runs both).
// Peak extra memory: the caching allocator's peak minus what was allocated before (q, k, v, dO).
#include "common/kernels/dflash_attn/dflash_attn.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/drafter/drafter_attention.h"
#include "scripts/bench/bench_flags.h"

namespace {

using dflash::bench::Flag;
using dflash::bench::StrFlag;

size_t Allocated() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
}
size_t Peak() { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak; }

struct Measure {
  double ms, peak_extra_gib;
};

// Median of `iters` timed runs (each synchronized) after three warm-ups.
Measure Time(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  c10::cuda::device_synchronize();
  const size_t base = Allocated();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    c10::cuda::device_synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], static_cast<double>(Peak() - base) / (1 << 30)};
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv,
      {"--anchors", "--block", "--context", "--doc-max", "--doc-min", "--head-dim", "--hkv", "--hq",
       "--iters", "--json", "--mask-out", "--seed", "--window", "--reference"},
      "dflash_attn");
  const int64_t t = Flag(argc, argv, "--context", 8192), n = Flag(argc, argv, "--anchors", 512);
  const int64_t b = Flag(argc, argv, "--block", 16), hq = Flag(argc, argv, "--hq", 32);
  const int64_t hkv = Flag(argc, argv, "--hkv", 8), d = Flag(argc, argv, "--head-dim", 128);
  const int64_t doc_min = Flag(argc, argv, "--doc-min", 200);
  const int64_t doc_max = Flag(argc, argv, "--doc-max", 2000);
  const int iters = static_cast<int>(Flag(argc, argv, "--iters", 20));
  const int64_t window = Flag(argc, argv, "--window", -1);  // -1: a full-attention layer
  const bool sliding = window >= 0;
  const bool with_reference = Flag(argc, argv, "--reference", 0) != 0;
  std::mt19937_64 rng(static_cast<uint64_t>(Flag(argc, argv, "--seed", 1)));
  if (c10::cuda::device_count() == 0) {
    std::fprintf(stderr, "dflash_attn: no CUDA device\n");
    return 1;
  }

  // Documents of doc_min..doc_max tokens filling the context; anchors where a+1 is in the same
  // document (method.md §3.1 without the loss mask), sorted.
  std::vector<int64_t> doc_ids, starts;
  while (static_cast<int64_t>(doc_ids.size()) < t) {
    const int64_t len = std::min(std::uniform_int_distribution<int64_t>(doc_min, doc_max)(rng),
                                 t - static_cast<int64_t>(doc_ids.size()));
    starts.push_back(static_cast<int64_t>(doc_ids.size()));
    doc_ids.insert(doc_ids.end(), len, static_cast<int64_t>(starts.size()) - 1);
  }
  std::set<int64_t> chosen;
  while (static_cast<int64_t>(chosen.size()) < n) {
    const int64_t a = std::uniform_int_distribution<int64_t>(0, t - 2)(rng);
    if (doc_ids[a + 1] == doc_ids[a]) chosen.insert(a);
  }
  const std::vector<int64_t> anchors(chosen.begin(), chosen.end());
  int64_t visible = 0;  // visible keys summed over query positions (per head)
  for (int64_t a : anchors) {
    for (int64_t k = 0; k < b; ++k) {
      const int64_t first = sliding && window > 0 ? std::max(starts[doc_ids[a]], a + k - window + 1)
                                                  : starts[doc_ids[a]];
      visible += std::max<int64_t>(0, a - first) + (sliding ? k + 1 : b);
    }
  }
  const double fwd_tflop = 4.0 * d * hq * static_cast<double>(visible) / 1e12;
  const double bwd_tflop = 2.5 * fwd_tflop;  // S, dP, dV, dK, dQ against S, O

  const std::string mask_out = StrFlag(argc, argv, "--mask-out");
  if (!mask_out.empty()) {
    FILE* f = std::fopen(mask_out.c_str(), "w");
    if (f == nullptr) {
      std::perror(mask_out.c_str());
      return 1;
    }
    std::fprintf(f, "%lld %lld %lld\n", static_cast<long long>(t), static_cast<long long>(n),
                 static_cast<long long>(b));
    for (int64_t x : doc_ids) std::fprintf(f, "%lld ", static_cast<long long>(x));
    std::fprintf(f, "\n");
    for (int64_t x : anchors) std::fprintf(f, "%lld ", static_cast<long long>(x));
    std::fprintf(f, "\n");
    std::fclose(f);
  }

  const c10::Device cuda(c10::kCUDA, 0);
  const auto opts = at::TensorOptions().device(cuda).dtype(at::kBFloat16);
  const int64_t q_rows = n * b;
  const at::Tensor q = at::randn({q_rows, hq, d}, opts).requires_grad_(true);
  const at::Tensor k = at::randn({t + q_rows, hkv, d}, opts).requires_grad_(true);
  const at::Tensor v = at::randn({t + q_rows, hkv, d}, opts).requires_grad_(true);
  const at::Tensor dout = at::randn({q_rows, hq, d}, opts);
  auto long_tensor = [&](const std::vector<int64_t>& x) {
    return at::tensor(at::ArrayRef<int64_t>(x), at::TensorOptions().dtype(at::kLong)).to(cuda);
  };
  dflash::drafter::BlockMask mask =
      dflash::drafter::BuildBlockMask(long_tensor(anchors), long_tensor(doc_ids), b);
  mask.causal = sliding;
  mask.window = sliding ? window : 0;
  const dflash::drafter::FusedDrafterAttention attn;
  if (!dflash::drafter::FusedDrafterAttention::Supports(q, k, mask)) {
    std::fprintf(stderr, "dflash_attn: this geometry has no fused kernel\n");
    return 1;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Measure fwd = Time(
      [&] {
        const at::Tensor o =
            attn.Forward(q.detach(), k.detach(), v.detach(), mask, scale);  // no graph kept
      },
      iters);
  const Measure both = Time(
      [&] {
        q.mutable_grad() = at::Tensor();
        k.mutable_grad() = at::Tensor();
        v.mutable_grad() = at::Tensor();
        attn.Forward(q, k, v, mask, scale).backward(dout);
      },
      iters);
  const double bwd_ms = both.ms - fwd.ms;
  Measure ref_fwd{0, 0}, ref_both{0, 0};
  if (with_reference) {
    const dflash::drafter::ReferenceDrafterAttention reference;
    ref_fwd = Time([&] { reference.Forward(q.detach(), k.detach(), v.detach(), mask, scale); },
                   std::max(3, iters / 4));
    ref_both = Time(
        [&] {
          q.mutable_grad() = at::Tensor();
          k.mutable_grad() = at::Tensor();
          v.mutable_grad() = at::Tensor();
          reference.Forward(q, k, v, mask, scale).backward(dout);
        },
        std::max(3, iters / 4));
  }
  const double io_gib =
      (q.nbytes() * 2 + k.nbytes() * 2 + v.nbytes() * 2 + dout.nbytes() * 2 + q_rows * hq * 4.0) /
      (1 << 30);  // q k v dO in, o dq dk dv out, lse
  std::printf(
      "context %lld, anchors %lld, B %lld, heads %lld/%lld, head_dim %lld, %d docs, bf16, %s, "
      "median of %d\n",
      static_cast<long long>(t), static_cast<long long>(n), static_cast<long long>(b),
      static_cast<long long>(hq), static_cast<long long>(hkv), static_cast<long long>(d),
      static_cast<int>(starts.size()),
      !sliding ? "full attention"
               : (window > 0 ? ("sliding window " + std::to_string(window)).c_str()
                             : "sliding, no window"),
      iters);
  std::printf("unmasked work: forward %.3f TFLOP, backward %.3f TFLOP\n", fwd_tflop, bwd_tflop);
  std::printf("| %-22s | %9s | %9s | %9s | %10s | %10s | %14s |\n", "implementation", "fwd ms",
              "bwd ms", "fwd+bwd", "fwd TFLOP/s", "bwd TFLOP/s", "peak extra GiB");
  std::printf("| %-22s | %9.3f | %9.3f | %9.3f | %10.1f | %10.1f | %14.3f |\n", "dflash fused",
              fwd.ms, bwd_ms, both.ms, fwd_tflop / fwd.ms * 1e3, bwd_tflop / bwd_ms * 1e3,
              both.peak_extra_gib);
  if (with_reference) {
    std::printf("| %-22s | %9.3f | %9.3f | %9.3f | %10.1f | %10.1f | %14.3f |\n",
                "unfused reference", ref_fwd.ms, ref_both.ms - ref_fwd.ms, ref_both.ms,
                fwd_tflop / ref_fwd.ms * 1e3, bwd_tflop / (ref_both.ms - ref_fwd.ms) * 1e3,
                ref_both.peak_extra_gib);
  }
  std::printf("memory bound of the target (inputs + outputs + LSE) x 1.1: %.3f GiB\n",
              io_gib * 1.1);
  const std::string json = StrFlag(argc, argv, "--json");
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::perror(json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"total_ms\": %.4f, \"peak_extra_gib\": "
                 "%.4f, \"fwd_tflop\": %.5f, \"bwd_tflop\": %.5f, \"io_gib\": %.4f, "
                 "\"window\": %lld, \"reference_total_ms\": %.4f}\n",
                 fwd.ms, bwd_ms, both.ms, both.peak_extra_gib, fwd_tflop, bwd_tflop, io_gib,
                 static_cast<long long>(window), ref_both.ms);
    std::fclose(f);
  }
  return 0;
}

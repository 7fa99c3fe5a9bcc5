// The fused DFlash attention on CUDA (common/kernels/dflash_attn) against the CPU reference
// (drafter::ReferenceDrafterAttention) computed in fp32 from the same bf16-rounded inputs: output,
// dQ, dK and dV. Fresh random geometry and values every run (the seed is printed): ragged
// documents, anchors at document starts (empty context) and ends, padding anchors in the middle and
// at the end, several head groupings, head dims 64 and 128, block sizes 16 and 10, full and
// sliding-window layers. Outputs and
// gradients are poisoned with NaN before each call. Also the packed causal forward of the target
// against a per-document fp32 reference. Labelled gpu; skipped without a CUDA device.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/triu.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "common/device/device_probe.h"
#include "common/drafter/drafter_attention.h"
#include "common/kernels/dflash_attn/dflash_attn.h"
#include "tests/common/max_rel_error.h"

namespace dflash::kernels {
namespace {

using dflash::testing::MaxRelError;

void Poison(const c10::Device& cuda) {
  // Freed NaN memory that the caching allocator hands to the op's outputs and gradients.
  at::full({256 << 20}, std::nan(""), at::TensorOptions().device(cuda));
}

struct Geometry {
  int64_t n_docs, doc_lo, doc_hi, n_anchors, hq, hkv, d, b;
};

struct MaskInputs {
  std::vector<int64_t> doc_ids, anchors;
};

MaskInputs RandomMask(const Geometry& g, std::mt19937_64& rng) {
  MaskInputs m;
  std::vector<int64_t> starts, ends;
  for (int64_t doc = 0; doc < g.n_docs; ++doc) {
    const int64_t len = std::uniform_int_distribution<int64_t>(g.doc_lo, g.doc_hi)(rng);
    starts.push_back(static_cast<int64_t>(m.doc_ids.size()));
    m.doc_ids.insert(m.doc_ids.end(), len, doc);
    ends.push_back(static_cast<int64_t>(m.doc_ids.size()) - 1);
  }
  const int64_t t = static_cast<int64_t>(m.doc_ids.size());
  std::set<int64_t> chosen = {starts.front(), ends.back(), starts[g.n_docs / 2],
                              ends[g.n_docs / 2]};  // blocks at position 0 and at document ends
  while (static_cast<int64_t>(chosen.size()) < std::min(g.n_anchors, t)) {
    chosen.insert(std::uniform_int_distribution<int64_t>(0, t - 1)(rng));
  }
  m.anchors.assign(chosen.begin(), chosen.end());
  // Dropped anchors: one in the middle of a document's run, two at the end.
  m.anchors.insert(m.anchors.begin() + static_cast<int64_t>(m.anchors.size()) / 2, -1);
  m.anchors.push_back(-1);
  m.anchors.push_back(-1);
  return m;
}

at::Tensor Long(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong));
}

// A sliding-attention layer's view of the mask (drafter_attention.h): causal inside the block and,
// with window > 0, only the context rows within `window` positions.
struct Sliding {
  bool causal = false;
  int64_t window = 0;
};

void RunDrafterCase(const Geometry& g, Sliding sliding = {}) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " hq " << g.hq << " hkv " << g.hkv << " d " << g.d << " B "
               << g.b << " causal " << sliding.causal << " window " << sliding.window);
  std::mt19937_64 rng(seed);
  const MaskInputs m = RandomMask(g, rng);
  const int64_t t = static_cast<int64_t>(m.doc_ids.size());
  const int64_t n = static_cast<int64_t>(m.anchors.size()), q_rows = n * g.b;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto bf16_rounded = [&](std::vector<int64_t> shape) {
    return at::randn(shape, gen, at::kFloat).to(at::kBFloat16).to(at::kFloat);
  };
  const at::Tensor q = bf16_rounded({q_rows, g.hq, g.d});
  const at::Tensor k = bf16_rounded({t + q_rows, g.hkv, g.d});
  const at::Tensor v = bf16_rounded({t + q_rows, g.hkv, g.d});
  const at::Tensor dout = bf16_rounded({q_rows, g.hq, g.d});
  const double scale = 1.0 / std::sqrt(static_cast<double>(g.d));

  // Reference in fp32 on the CPU.
  drafter::BlockMask mask_cpu = drafter::BuildBlockMask(Long(m.anchors), Long(m.doc_ids), g.b);
  mask_cpu.causal = sliding.causal;
  mask_cpu.window = sliding.window;
  const at::Tensor q_ref = q.clone().requires_grad_(true), k_ref = k.clone().requires_grad_(true),
                   v_ref = v.clone().requires_grad_(true);
  const at::Tensor out_ref =
      drafter::ReferenceDrafterAttention().Forward(q_ref, k_ref, v_ref, mask_cpu, scale);
  out_ref.backward(dout);

  const c10::Device cuda(c10::kCUDA, 0);
  drafter::BlockMask mask =
      drafter::BuildBlockMask(Long(m.anchors).to(cuda), Long(m.doc_ids).to(cuda), g.b);
  mask.causal = sliding.causal;
  mask.window = sliding.window;
  const at::Tensor q_gpu = q.to(cuda, at::kBFloat16).requires_grad_(true);
  const at::Tensor k_gpu = k.to(cuda, at::kBFloat16).requires_grad_(true);
  const at::Tensor v_gpu = v.to(cuda, at::kBFloat16).requires_grad_(true);
  ASSERT_TRUE(drafter::FusedDrafterAttention::Supports(q_gpu, k_gpu, mask));
  const drafter::FusedDrafterAttention fused;
  Poison(cuda);
  const at::Tensor out = fused.Forward(q_gpu, k_gpu, v_gpu, mask, scale);
  Poison(cuda);
  out.backward(dout.to(cuda, at::kBFloat16));
  for (const auto& [name, got, want] :
       {std::tuple{"out", out, out_ref}, std::tuple{"dq", q_gpu.grad(), q_ref.grad()},
        std::tuple{"dk", k_gpu.grad(), k_ref.grad()},
        std::tuple{"dv", v_gpu.grad(), v_ref.grad()}}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(got.defined());
    EXPECT_FALSE(at::isnan(got).any().item<bool>());
    EXPECT_LT(MaxRelError(got, want), 2e-2);
  }
  // Padding blocks: zero output rows.
  for (int64_t j = 0; j < n; ++j) {
    if (m.anchors[j] >= 0) continue;
    EXPECT_EQ(out.narrow(0, j * g.b, g.b).abs().max().item<float>(), 0.f) << "padding block " << j;
  }
  // A second call with the same mask reuses the plan and gives the same output.
  const at::Tensor again =
      fused.Forward(q_gpu.detach(), k_gpu.detach(), v_gpu.detach(), mask, scale);
  EXPECT_EQ(MaxRelError(again, out), 0.0);
}

class DflashAttnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(DflashAttnGpu, Gqa4Hd128MatchesTheReference) {
  RunDrafterCase({12, 1, 400, 96, 8, 2, 128, 16});  // Qwen3-8B's grouping and head dim
}

// Sliding-window layers: the kernels skip the key tiles outside every window of a block and mask
// the rest per row (context) and per slot (the block, causal).
TEST_F(DflashAttnGpu, SlidingWindowLayersMatchTheReference) {
  for (const int64_t window : {16, 17, 50, 200}) {
    RunDrafterCase({12, 1, 400, 96, 8, 2, 128, 16}, {true, window});
  }
  RunDrafterCase({12, 1, 400, 96, 8, 2, 128, 16}, {true, 0});  // causal block, no window
  RunDrafterCase({6, 20, 300, 40, 4, 1, 64, 16}, {true, 33});
  RunDrafterCase({5, 20, 300, 30, 12, 4, 128, 16}, {true, 70});  // 3 per kv head
  RunDrafterCase({7, 5, 250, 50, 8, 2, 128, 10}, {true, 10});    // block 10, window = block
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(0);
  if (prop->major == 9 && prop->minor == 0) {
    RunDrafterCase({5, 20, 300, 30, 24, 4, 256, 16}, {true, 100});  // Qwen3.5-27B's heads
  }
}

// A full and a sliding layer of one step share the mask's plan cache: each gets its own plan.
TEST_F(DflashAttnGpu, AFullAndASlidingLayerOfOneMaskKeepTheirOwnPlans) {
  const c10::Device cuda(c10::kCUDA, 0);
  std::vector<int64_t> doc_ids(300, 0);
  std::fill(doc_ids.begin() + 120, doc_ids.end(), 1);
  drafter::BlockMask full =
      drafter::BuildBlockMask(Long({50, 119, 200, 299}).to(cuda), Long(doc_ids).to(cuda), 16);
  drafter::BlockMask sliding = full;  // shares the plan cache
  sliding.causal = true;
  sliding.window = 32;
  at::Generator gen = at::detail::createCPUGenerator(7);
  const auto opts = at::TensorOptions().device(cuda).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({64, 8, 128}, gen, at::kFloat).to(opts);
  const at::Tensor k = at::randn({364, 2, 128}, gen, at::kFloat).to(opts);
  const at::Tensor v = at::randn({364, 2, 128}, gen, at::kFloat).to(opts);
  const drafter::FusedDrafterAttention fused;
  const drafter::ReferenceDrafterAttention reference;
  for (const drafter::BlockMask* mask : {&full, &sliding, &full, &sliding}) {
    EXPECT_LT(MaxRelError(fused.Forward(q, k, v, *mask, 0.088),
                          reference.Forward(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                            *mask, 0.088)),
              2e-2)
        << "window " << mask->window;
  }
}

TEST_F(DflashAttnGpu, Hd256MatchesTheReference) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(0);
  if (prop->major != 9 || prop->minor != 0) GTEST_SKIP() << "head dim 256 needs sm_90";
  RunDrafterCase({6, 20, 300, 40, 8, 2, 256, 16});  // the backward splits its columns in halves
  RunDrafterCase({4, 10, 200, 25, 2, 2, 256, 10});
  RunDrafterCase({5, 20, 300, 30, 24, 4, 256, 16});  // Qwen3.5-27B's heads: 6 per kv head
}

TEST_F(DflashAttnGpu, Hd64AndOtherGroupingsMatchTheReference) {
  RunDrafterCase({6, 20, 300, 40, 4, 1, 64, 16});    // 4 heads per kv head
  RunDrafterCase({5, 30, 200, 30, 16, 2, 128, 16});  // 8 per kv head: 2 tiles per block
  RunDrafterCase({4, 10, 150, 25, 2, 2, 64, 16});    // no grouping
  RunDrafterCase({7, 5, 250, 50, 8, 2, 128, 10});
  RunDrafterCase({5, 20, 300, 30, 12, 4, 128, 16});  // 3 per kv head: 21 positions, 63 rows
  RunDrafterCase(
      {4, 20, 200, 20, 10, 2, 64, 10});  // 5 per kv head, B 10: 12 positions    // block size 10
}

void RunCausalCases() {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (const auto& [hq, hkv, d] :
       {std::tuple{8, 2, 128}, std::tuple{4, 4, 64}, std::tuple{12, 2, 128}}) {
    std::vector<int64_t> cu = {0};
    for (int i = 0; i < 9; ++i) {
      cu.push_back(cu.back() + std::uniform_int_distribution<int64_t>(1, 300)(rng));
    }
    cu.insert(cu.begin() + 3, cu[2]);  // an empty document
    const int64_t t = cu.back();
    auto rounded = [&](int64_t heads) {
      return at::randn({t, heads, d}, gen, at::kFloat).to(at::kBFloat16).to(at::kFloat);
    };
    const at::Tensor q = rounded(hq), k = rounded(hkv), v = rounded(hkv);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i + 1 < cu.size(); ++i) {
      const int64_t b = cu[i], len = cu[i + 1] - cu[i];
      if (len == 0) continue;
      const at::Tensor qd = q.narrow(0, b, len).permute({1, 0, 2});  // [Hq, L, D]
      const at::Tensor kd = k.narrow(0, b, len).repeat_interleave(hq / hkv, 1).permute({1, 0, 2});
      const at::Tensor vd = v.narrow(0, b, len).repeat_interleave(hq / hkv, 1).permute({1, 0, 2});
      at::Tensor s = at::matmul(qd, kd.transpose(1, 2)) * scale;
      s = s.masked_fill(at::triu(at::ones({len, len}, at::kBool), 1), -INFINITY);
      parts.push_back(at::matmul(at::softmax(s, -1), vd).permute({1, 0, 2}));
    }
    const at::Tensor want = at::cat(parts, 0);
    const c10::Device cuda(c10::kCUDA, 0);
    Poison(cuda);
    const at::Tensor got =
        FusedCausalVarlenAttention(q.to(cuda, at::kBFloat16), k.to(cuda, at::kBFloat16),
                                   v.to(cuda, at::kBFloat16), Long(cu), scale);
    EXPECT_FALSE(at::isnan(got).any().item<bool>());
    EXPECT_LT(MaxRelError(got, want), 2e-2) << "hq " << hq << " hkv " << hkv << " d " << d;
  }
}

TEST_F(DflashAttnGpu, CausalVarlenMatchesPerDocumentReference) { RunCausalCases(); }

// The mma.sync kernels (devices other than compute capability 9.0) stay correct beside the wgmma
// ones that the H200 runs by default.
TEST_F(DflashAttnGpu, MmaKernelsMatchTheReference) {
  ASSERT_EQ(setenv("DFLASH_ATTN_FWD_KERNEL", "mma", 1), 0);
  ASSERT_EQ(setenv("DFLASH_ATTN_BWD_KERNEL", "mma", 1), 0);
  RunDrafterCase({12, 1, 400, 96, 8, 2, 128, 16});
  RunDrafterCase({6, 20, 300, 40, 4, 1, 64, 16});
  RunDrafterCase({12, 1, 400, 96, 8, 2, 128, 16}, {true, 50});
  RunCausalCases();
  ASSERT_EQ(unsetenv("DFLASH_ATTN_FWD_KERNEL"), 0);
  ASSERT_EQ(unsetenv("DFLASH_ATTN_BWD_KERNEL"), 0);
}

TEST_F(DflashAttnGpu, UnsupportedCallsFallBackOrAreRefused) {
  const c10::Device cuda(c10::kCUDA, 0);
  const auto opts = at::TensorOptions().device(cuda);
  const at::Tensor q32 = at::randn({16, 4, 64}, opts), k32 = at::randn({32, 2, 64}, opts);
  const drafter::BlockMask mask =
      drafter::BuildBlockMask(Long({3}).to(cuda), Long(std::vector<int64_t>(16, 0)).to(cuda), 16);
  EXPECT_FALSE(drafter::FusedDrafterAttention::Supports(q32, k32, mask)) << "fp32 -> reference";
  EXPECT_FALSE(drafter::FusedDrafterAttention::Supports(
      at::randn({16, 4, 96}, opts.dtype(at::kBFloat16)),
      at::randn({32, 2, 96}, opts.dtype(at::kBFloat16)), mask))
      << "head dim 96";
  const at::Tensor out = drafter::FusedDrafterAttention().Forward(q32, k32, k32, mask, 0.125);
  EXPECT_EQ(out.sizes(), q32.sizes());
  EXPECT_THROW(MakeDflashAttnPlan(Long({5, 3}), Long({0, 0}), 16, 16, 4, cuda), c10::Error)
      << "anchors out of order";
  drafter::BlockMask narrow = mask;
  narrow.causal = true;
  narrow.window = 8;  // below the block: would hide block keys too
  EXPECT_FALSE(drafter::FusedDrafterAttention::Supports(
      at::randn({16, 4, 64}, opts.dtype(at::kBFloat16)),
      at::randn({32, 2, 64}, opts.dtype(at::kBFloat16)), narrow))
      << "window 8 < block 16 -> reference";
}

}  // namespace
}  // namespace dflash::kernels

// The CUDA paths of VarlenCausalAttention (flash-attention varlen for fp16/bf16, per-document SDPA
// otherwise) against the explicit reference, on the same GPU. Skipped without a CUDA device.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "common/nn/attention.h"

namespace dflash::nn {
namespace {

struct Case {
  c10::ScalarType dtype;
  int64_t head_dim;
  double tolerance;  // on max |got - want| / max |want|
};

void ExpectMatchesReference(const Case& c) {
  // Documents of 1, 128, 1024, 0 and 47 tokens; 8 query heads reading 2 kv heads.
  const std::vector<int32_t> cu = {0, 1, 129, 1153, 1153, 1200};
  const int64_t t = cu.back(), hq = 8, hkv = 2;
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(c.dtype);
  at::Tensor q = at::randn({t, hq, c.head_dim}, options);
  at::Tensor k = at::randn({t, hkv, c.head_dim}, options);
  at::Tensor v = at::randn({t, hkv, c.head_dim}, options);
  const at::Tensor cu_seqlens = at::tensor(cu, at::TensorOptions().dtype(at::kInt));
  const VarlenDocs docs = VarlenDocs::FromCuSeqlens(cu_seqlens, q.device());
  const double scale = 1.0 / 8.0;
  at::Tensor got = VarlenCausalAttention(q, k, v, docs, scale);
  ASSERT_EQ(got.sizes(), q.sizes());
  ASSERT_EQ(got.scalar_type(), c.dtype);
  // The reference in fp32 from the same (rounded) inputs.
  at::Tensor want = VarlenCausalAttentionReference(q.to(at::kFloat), k.to(at::kFloat),
                                                   v.to(at::kFloat), docs, scale);
  const double err =
      (got.to(at::kFloat) - want).abs().max().item<double>() / want.abs().max().item<double>();
  std::printf("%s head_dim %ld: max relative error %.3g\n", c10::toString(c.dtype),
              static_cast<long>(c.head_dim), err);
  EXPECT_LT(err, c.tolerance) << c10::toString(c.dtype) << " head_dim " << c.head_dim;
}

TEST(VarlenAttentionGpu, FlashVarlenMatchesReference) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  ExpectMatchesReference({at::kBFloat16, 128, 1e-2});
  ExpectMatchesReference({at::kHalf, 64, 2e-3});
}

TEST(VarlenAttentionGpu, SdpaFallbackMatchesReference) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  ExpectMatchesReference({at::kFloat, 128, 1e-4});
  ExpectMatchesReference({at::kBFloat16, 36, 1e-2});  // head_dim % 8 != 0: not flash
}

// The start event's report names the kernel that runs: flash where its dtype and head dim allow,
// SDPA per document otherwise (the two cases above), the reference on the CPU.
TEST(VarlenAttentionGpu, TheKernelReportNamesWhatRuns) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const c10::Device cuda(c10::kCUDA, 0);
  EXPECT_EQ(VarlenAttentionKernel(cuda, at::kBFloat16, 128), "flash varlen");
  EXPECT_EQ(VarlenAttentionKernel(cuda, at::kBFloat16, 36),
            "SDPA per document (BFloat16, head_dim 36)");
  EXPECT_EQ(VarlenAttentionKernel(cuda, at::kFloat, 128),
            "SDPA per document (Float, head_dim 128)");
  EXPECT_EQ(VarlenAttentionKernel(c10::Device(c10::kCPU), at::kBFloat16, 128),
            "reference (the CPU)");
}

}  // namespace
}  // namespace dflash::nn

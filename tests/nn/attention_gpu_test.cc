// The CUDA paths of VarlenCausalAttention (flash-attention varlen for fp16/bf16, per-document SDPA
// otherwise) against the explicit reference, on the same GPU. Skipped without a CUDA device.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/nn/attention.h"

namespace dflash::nn {
namespace {

struct Case {
  c10::ScalarType dtype;
  int64_t head_dim;
  double tolerance;  // on max |got - want| / max |want|
  // Documents of 1, 128, 1024, 0 and 47 tokens by default.
  std::vector<int32_t> cu = {0, 1, 129, 1153, 1153, 1200};
  int64_t cudnn_min_tokens = 4096;  // VarlenCausalAttention's argument
};

void ExpectMatchesReference(const Case& c) {
  // 8 query heads reading 2 kv heads.
  const std::vector<int32_t>& cu = c.cu;
  const int64_t t = cu.back(), hq = 8, hkv = 2;
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(c.dtype);
  at::Tensor q = at::randn({t, hq, c.head_dim}, options);
  at::Tensor k = at::randn({t, hkv, c.head_dim}, options);
  at::Tensor v = at::randn({t, hkv, c.head_dim}, options);
  const at::Tensor cu_seqlens = at::tensor(cu, at::TensorOptions().dtype(at::kInt));
  const VarlenDocs docs = VarlenDocs::FromCuSeqlens(cu_seqlens, q.device());
  const double scale = 1.0 / 8.0;
  at::Tensor got = VarlenCausalAttention(q, k, v, docs, scale, c.cudnn_min_tokens);
  ASSERT_EQ(got.sizes(), q.sizes());
  ASSERT_EQ(got.scalar_type(), c.dtype);
  // The reference in fp32 from the same (rounded) inputs.
  at::Tensor want = VarlenCausalAttentionReference(q.to(at::kFloat), k.to(at::kFloat),
                                                   v.to(at::kFloat), docs, scale);
  const double err =
      (got.to(at::kFloat) - want).abs().max().item<double>() / want.abs().max().item<double>();
  std::printf(
      "%s head_dim %ld, %zu documents, %lld tokens, cuDNN from %lld tokens: max relative "
      "error %.3g\n",
      c10::toString(c.dtype), static_cast<long>(c.head_dim), cu.size() - 1,
      static_cast<long long>(t), static_cast<long long>(c.cudnn_min_tokens), err);
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

// Long documents through cuDNN, one call each, between runs of short ones through flash varlen
// (and a long one first and last), against the reference; the same documents with cuDNN off.
TEST(VarlenAttentionGpu, LongDocumentsThroughCudnnMatchReference) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const std::vector<int32_t> mixed = {0, 3, 5003, 5300, 9396, 9403};  // 3, 5000, 297, 4096, 7
  const std::vector<int32_t> long_first_last = {0, 4100, 4150, 8250};
  for (int64_t min_tokens : {int64_t{4096}, int64_t{0}}) {
    ExpectMatchesReference({at::kBFloat16, 128, 1e-2, mixed, min_tokens});
    ExpectMatchesReference({at::kHalf, 64, 2e-3, long_first_last, min_tokens});
  }
  ExpectMatchesReference({at::kBFloat16, 128, 1e-2, {0, 8192}, 4096});  // one document
}

// The start event's report names the kernel that runs: flash where its dtype and head dim allow,
// SDPA per document otherwise (the two cases above), the reference on the CPU.
TEST(VarlenAttentionGpu, TheKernelReportNamesWhatRuns) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const c10::Device cuda(c10::kCUDA, 0);
  const int64_t min_tokens = CudnnAttentionMinTokens();
  EXPECT_EQ(VarlenAttentionKernel(cuda, at::kBFloat16, 128),
            min_tokens > 0
                ? "flash varlen; documents of " + std::to_string(min_tokens) + "+ tokens: cuDNN"
                : std::string("flash varlen"));
  EXPECT_EQ(VarlenAttentionKernel(cuda, at::kBFloat16, 256), "flash varlen");  // not cuDNN
  EXPECT_EQ(VarlenAttentionKernel(cuda, at::kBFloat16, 36),
            "SDPA per document (BFloat16, head_dim 36)");
  EXPECT_EQ(VarlenAttentionKernel(cuda, at::kFloat, 128),
            "SDPA per document (Float, head_dim 128)");
  EXPECT_EQ(VarlenAttentionKernel(c10::Device(c10::kCPU), at::kBFloat16, 128),
            "reference (the CPU)");
}

}  // namespace
}  // namespace dflash::nn

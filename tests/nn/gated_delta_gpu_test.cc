// Hybrid targets on the GPU: the chunked gated delta rule on CUDA against the
// sequential CPU reference (fresh random inputs, ragged documents, fp32 and bf16), and the whole
// Qwen3-Next / Qwen3.5 / Qwen3.5-MoE tiny models on CUDA against the transformers fp32 references.
// Skipped without a CUDA device.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/nn/gated_delta.h"
#include "common/nn/target_model.h"
#include "tests/nn/oracle.h"

namespace dflash::nn {
namespace {

using oracle::ReadAll;
using oracle::RelError;
using oracle::ToVector;

const c10::Device kCuda(c10::kCUDA, 0);

VarlenDocs Docs(const std::vector<int32_t>& lengths, c10::Device device) {
  std::vector<int32_t> cu = {0};
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  return VarlenDocs::FromCuSeqlens(at::tensor(cu, at::kInt), device);
}

// Both forms of the chunk-to-chunk recurrence on CUDA (the kernel of common/kernels/gated_delta
// and the ATen step loop) against the token-by-token CPU reference, at key/value head dims the
// kernel runs (128/128, 64/64, 256/32) and one it leaves to the loop (96 value columns).
TEST(GatedDeltaGpuTest, ChunkedScanOnCudaMatchesTheCpuReference) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  at::manual_seed(std::chrono::steady_clock::now().time_since_epoch().count());
  const std::vector<int32_t> lengths = {0, 1, 130, 64, 7, 300, 0, 33};
  int64_t t = 0;
  for (int32_t n : lengths) t += n;
  struct Shape {
    int64_t hv, dk, dv;
  };
  for (const Shape& sh :
       {Shape{6, 128, 128}, Shape{3, 64, 64}, Shape{2, 256, 32}, Shape{2, 128, 96}}) {
    const at::Tensor q = at::randn({t, sh.hv, sh.dk}), k = at::randn({t, sh.hv, sh.dk});
    const at::Tensor v = at::randn({t, sh.hv, sh.dv}), g = -2.0 * at::rand({t, sh.hv});
    const at::Tensor beta = at::rand({t, sh.hv});
    const VarlenDocs docs = Docs(lengths, kCuda);
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      auto on = [&](const at::Tensor& x) { return x.to(kCuda, dtype); };
      // bf16 inputs: the reference runs from the same rounded values, in fp32.
      const at::Tensor ref = GatedDeltaRuleReference(on(q).cpu(), on(k).cpu(), on(v).cpu(), g,
                                                     on(beta).cpu(), Docs(lengths, at::kCPU))
                                 .to(at::kFloat);
      for (bool fused : {true, false}) {
        at::Tensor got =
            GatedDeltaRuleChunked(on(q), on(k), on(v), g.to(kCuda), on(beta), docs, 64, fused);
        ASSERT_TRUE(got.is_cuda());
        ASSERT_EQ(got.scalar_type(), dtype);
        EXPECT_FALSE(got.isnan().any().item<bool>());
        const double err = RelError(got, ref);
        std::printf("delta rule on cuda, dk %ld dv %ld %s, %s: max relative error %.3g\n",
                    static_cast<long>(sh.dk), static_cast<long>(sh.dv), c10::toString(dtype),
                    fused ? "kernel" : "step loop", err);
        EXPECT_LT(err, dtype == at::kFloat ? 1e-4 : 2e-2);
      }
    }
  }
}

// The tiny hybrid checkpoints of the two oracles on CUDA, fp32, against transformers.
void ExpectGpuParity(const std::filesystem::path& dir, const std::string& family) {
  auto refs = ReadAll(dir / (family + "_refs.safetensors"));
  TargetModelOptions options;
  options.layer_ids = ToVector(refs["layer_ids"]);
  options.dtype = at::kFloat;
  options.device = kCuda;
  auto model = TargetModel::Load((dir / family).string(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  auto features = (*model)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
  ASSERT_TRUE(features.ok()) << features.status();
  ASSERT_TRUE(features->is_cuda());
  const int64_t h = (*model)->config().hidden_size;
  for (size_t slot = 0; slot < options.layer_ids.size(); ++slot) {
    const double err =
        RelError(features->narrow(1, slot * h, h), refs["features"].narrow(1, slot * h, h));
    std::printf("%s float on cuda, layer %ld: max relative error %.3g\n", family.c_str(),
                static_cast<long>(options.layer_ids[slot]), err);
    EXPECT_LT(err, 1e-4) << family << " layer " << options.layer_ids[slot];
  }
}

TEST(HybridTargetGpuTest, Fp32MatchesTransformers) {
  if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const std::string error = oracle::GenerateOracleOutputs();
  ASSERT_TRUE(error.empty()) << error;
  ExpectGpuParity(oracle::OracleDir(), "qwen3_next");
  const std::string error35 = oracle::GenerateQwen35OracleOutputs();
  ASSERT_TRUE(error35.empty()) << error35;
  ExpectGpuParity(oracle::Qwen35OracleDir(), "qwen3_5");
  ExpectGpuParity(oracle::Qwen35OracleDir(), "qwen3_5_moe");
}

}  // namespace
}  // namespace dflash::nn

// The target model on the GPU against the Hugging Face fp32 references of hf_oracle.py (the CPU
// parity test's tiny Qwen3 and Llama, 4 packed documents): bf16 through the flash varlen path, and
// fp32 through the per-document SDPA path. Skipped without a CUDA device.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/nn/target_model.h"
#include "tests/nn/oracle.h"

namespace dflash::nn {
namespace {

using oracle::OracleDir;
using oracle::ReadAll;
using oracle::RelError;
using oracle::ToVector;

class TargetModelGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (at::getNumGPUs() > 0) *oracle_error_ = oracle::GenerateOracleOutputs();
  }
  void SetUp() override {
    if (at::getNumGPUs() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    ASSERT_TRUE(oracle_error_->empty()) << *oracle_error_;
  }

  // Loads <family> in `dtype` on the GPU, runs the packed batch (inputs on the CPU) and compares
  // each captured layer with the fp32 reference: max |ours - HF| / max |HF| < tolerance.
  static void ExpectParity(const std::string& family, c10::ScalarType dtype, double tolerance) {
    auto refs = ReadAll(OracleDir() / (family + "_refs.safetensors"));
    TargetModelOptions options;
    options.layer_ids = ToVector(refs["layer_ids"]);
    options.dtype = dtype;
    options.device = c10::Device(c10::kCUDA, 0);
    auto model = TargetModel::Load((OracleDir() / family).string(), options);
    ASSERT_TRUE(model.ok()) << model.status();
    auto features = (*model)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
    ASSERT_TRUE(features.ok()) << features.status();
    ASSERT_TRUE(features->is_cuda());
    ASSERT_EQ(features->scalar_type(), dtype);
    ASSERT_EQ(features->sizes(), refs["features"].sizes());
    const int64_t h = (*model)->config().hidden_size;
    for (size_t slot = 0; slot < options.layer_ids.size(); ++slot) {
      const double err =
          RelError(features->narrow(1, slot * h, h), refs["features"].narrow(1, slot * h, h));
      std::printf("%s %s on cuda, layer %ld: max relative error %.3g\n", family.c_str(),
                  c10::toString(dtype), static_cast<long>(options.layer_ids[slot]), err);
      EXPECT_LT(err, tolerance) << family << " layer " << options.layer_ids[slot];
    }
  }

  static std::string* oracle_error_;
};

std::string* TargetModelGpuTest::oracle_error_ = new std::string;

// bf16 keeps 8 mantissa bits (relative rounding 2^-9 = 2e-3 per operation); through up to 8
// layers of random weights the captured residual stream drifts to about 1e-2 of its scale.
TEST_F(TargetModelGpuTest, Bf16MatchesTransformers) {
  ExpectParity("qwen3", at::kBFloat16, 2e-2);
  ExpectParity("llama", at::kBFloat16, 2e-2);
}

// fp32 on the GPU (SDPA per document; cuBLAS without TF32, LibTorch's default) is as close to HF
// as the CPU run.
TEST_F(TargetModelGpuTest, Fp32MatchesTransformers) {
  ExpectParity("qwen3", at::kFloat, 1e-4);
  ExpectParity("llama", at::kFloat, 1e-4);
  // Qwen3-MoE's grouped expert path on CUDA (fp32 only: in bf16 a token whose top-2 router
  // probabilities nearly tie may pick another expert than HF's fp32 run, a legitimate difference
  // far above 2e-2 for that token).
  ExpectParity("qwen3_moe", at::kFloat, 1e-4);
}

}  // namespace
}  // namespace dflash::nn

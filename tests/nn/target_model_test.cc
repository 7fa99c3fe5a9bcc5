// CPU parity of the LibTorch target model with Hugging Face transformers (fp32), on tiny random
// Qwen3 and Llama checkpoints written by hf_oracle.py, plus packing invariance and load errors.
#include "common/nn/target_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/model/hf_config.h"
#include "common/model/safetensors.h"
#include "common/nn/attention.h"
#include "tests/nn/oracle.h"

namespace dflash::nn {
namespace {

namespace fs = std::filesystem;
using oracle::GenerateOracleOutputs;
using oracle::ReadAll;
using oracle::RelError;
using oracle::ToVector;

class TargetModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { *oracle_error_ = GenerateOracleOutputs(); }
  void SetUp() override { ASSERT_TRUE(oracle_error_->empty()) << *oracle_error_; }

  static fs::path Dir() { return oracle::OracleDir(); }

  static TargetModelOptions Fp32(std::vector<int64_t> layer_ids = {}) {
    TargetModelOptions options;
    options.layer_ids = std::move(layer_ids);
    options.dtype = at::kFloat;
    return options;
  }

  // Loads <family> and compares the packed forward with <family>_refs.safetensors, per layer slot.
  void ExpectParity(const std::string& family, const std::vector<int64_t>& layer_ids) {
    auto refs = ReadAll(Dir() / (family + "_refs.safetensors"));
    auto model = TargetModel::Load((Dir() / family).string(), Fp32(layer_ids));
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->layer_ids(), ToVector(refs["layer_ids"]));
    auto features = (*model)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
    ASSERT_TRUE(features.ok()) << features.status();
    const int64_t h = (*model)->config().hidden_size;
    ASSERT_EQ(features->sizes(), refs["features"].sizes());
    for (size_t slot = 0; slot < (*model)->layer_ids().size(); ++slot) {
      const double err =
          RelError(features->narrow(1, slot * h, h), refs["features"].narrow(1, slot * h, h));
      std::printf("%s layer %ld: max relative error %.3g\n", family.c_str(),
                  static_cast<long>((*model)->layer_ids()[slot]), err);
      EXPECT_LT(err, 1e-4) << family << " layer " << (*model)->layer_ids()[slot];
    }
  }

  static std::string* oracle_error_;
};

std::string* TargetModelTest::oracle_error_ = new std::string;

TEST_F(TargetModelTest, Qwen3MatchesTransformers) {
  ExpectParity("qwen3", {});  // default layer ids for 8 layers, K = 5: [1, 2, 3, 4, 5]
}

TEST_F(TargetModelTest, LlamaMatchesTransformers) {
  ExpectParity("llama", {0, 3, 1});  // unsorted; 3 is the last layer (captured before the norm)
}

// Qwen3-MoE: sparse layers 0, 2, 3 (8 experts, top 2, renormalized) and the dense
// layer 1 of mlp_only_layers, packed documents against HF one document at a time.
TEST_F(TargetModelTest, Qwen3MoeMatchesTransformers) {
  ExpectParity("qwen3_moe", {0, 1, 2, 3});
  auto model = TargetModel::Load((Dir() / "qwen3_moe").string(), Fp32({0}));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().num_experts, 8);
  EXPECT_TRUE((*model)->config().norm_topk_prob);
}

// transformers 5 stores a sparse layer's experts stacked (mlp.experts.gate_up_proj [E, 2I, H],
// mlp.experts.down_proj [E, H, I]); the same weights in that layout give the same features.
// Hybrid: gated delta-rule layers (fused per-key-head projections), gated full attention with
// partial RoPE, zero-centered norms, MoE with a shared expert and one dense layer; documents of
// 1..150 tokens (several 64-token chunks).
TEST_F(TargetModelTest, Qwen3NextMatchesTransformers) {
  ExpectParity("qwen3_next", {0, 1, 2, 3, 4});
}

// Qwen3-Next generates too (hybrid_target_test.cc has the Qwen3.5 families): a sequence extended in
// pieces gives the rows of the packed forward (fused per-key-head projections, gated attention
// with partial RoPE, zero-centered norms).
TEST_F(TargetModelTest, Qwen3NextCachedStepsMatchThePackedForward) {
  TargetModelOptions options = Fp32({0, 1, 2, 3, 4});
  options.full = true;
  auto model = TargetModel::Load((Dir() / "qwen3_next").string(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> seq = {3, 17, 200, 5, 9, 41, 41, 7, 128, 64, 2};
  const int64_t t = static_cast<int64_t>(seq.size());
  auto packed = (*model)->Forward(at::tensor(seq, at::kLong), at::arange(t, at::kLong),
                                  at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(t)},
                                             at::TensorOptions().dtype(at::kInt)));
  ASSERT_TRUE(packed.ok()) << packed.status();
  auto cache = KvCache::Create(**model, 1, 16);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<at::Tensor> features;
  size_t at = 0;
  for (size_t n : {4, 1, 6}) {
    std::vector<int64_t> part(seq.begin() + at, seq.begin() + at + n);
    auto out = (*model)->Extend({0}, {part}, cache->get(), true);
    ASSERT_TRUE(out.ok()) << out.status();
    features.push_back(out->features);
    at += n;
  }
  const double err = RelError(at::cat(features), *packed);
  std::printf("qwen3_next cached against packed: max relative error %.3g\n", err);
  EXPECT_LT(err, 1e-4);
}

TEST_F(TargetModelTest, StackedExpertLayoutGivesTheSameModel) {
  std::map<std::string, at::Tensor> tensors = ReadAll(Dir() / "qwen3_moe" / "model.safetensors");
  ASSERT_FALSE(tensors.empty());
  auto config = model::LoadHfConfig((Dir() / "qwen3_moe").string());
  ASSERT_TRUE(config.ok()) << config.status();
  for (int64_t i : {0, 2, 3}) {  // the sparse layers
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.experts.";
    std::vector<at::Tensor> gate, up, down;
    for (int64_t e = 0; e < config->num_experts; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      gate.push_back(tensors.at(x + "gate_proj.weight"));
      up.push_back(tensors.at(x + "up_proj.weight"));
      down.push_back(tensors.at(x + "down_proj.weight"));
      for (const char* w : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
        tensors.erase(x + w);
      }
    }
    tensors[p + "gate_up_proj"] = at::cat({at::stack(gate), at::stack(up)}, 1);
    tensors[p + "down_proj"] = at::stack(down);
  }
  auto refs = ReadAll(Dir() / "qwen3_moe_refs.safetensors");
  auto loaded = TargetModel::Load((Dir() / "qwen3_moe").string(), Fp32({0, 1, 2, 3}));
  auto stacked = TargetModel::FromTensors(*config, tensors, Fp32({0, 1, 2, 3}));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  auto a = (*loaded)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
  auto b = (*stacked)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(*a, *b));
  // A stacked tensor of the wrong shape is named.
  tensors["model.layers.2.mlp.experts.down_proj"] = at::zeros({8, 32, 64});
  auto bad = TargetModel::FromTensors(*config, tensors, Fp32({0, 1, 2, 3}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("model.layers.2.mlp.experts.down_proj"),
            std::string::npos)
      << bad.status();
}

TEST_F(TargetModelTest, PackingOrderDoesNotChangeDocumentFeatures) {
  for (const std::string family : {"qwen3", "llama"}) {
    auto refs = ReadAll(Dir() / (family + "_refs.safetensors"));
    auto model = TargetModel::Load((Dir() / family).string(), Fp32(ToVector(refs["layer_ids"])));
    ASSERT_TRUE(model.ok()) << model.status();
    auto packed = (*model)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
    ASSERT_TRUE(packed.ok()) << packed.status();

    // The same documents packed in another order, run into a caller-provided buffer.
    const std::vector<int64_t> cu = ToVector(refs["cu_seqlens"]);
    const std::vector<size_t> order = {2, 0, 3, 1};
    ASSERT_EQ(order.size() + 1, cu.size());
    std::vector<at::Tensor> ids, positions;
    std::vector<int32_t> new_cu = {0};
    for (size_t d : order) {
      ids.push_back(refs["input_ids"].narrow(0, cu[d], cu[d + 1] - cu[d]));
      positions.push_back(refs["positions"].narrow(0, cu[d], cu[d + 1] - cu[d]));
      new_cu.push_back(new_cu.back() + static_cast<int32_t>(cu[d + 1] - cu[d]));
    }
    at::Tensor reordered = at::empty(packed->sizes(), packed->options());
    ASSERT_TRUE((*model)
                    ->Forward(at::cat(ids), at::cat(positions),
                              at::tensor(new_cu, at::TensorOptions().dtype(at::kInt)), reordered)
                    .ok());
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t n = cu[order[i] + 1] - cu[order[i]];
      at::Tensor a = packed->narrow(0, cu[order[i]], n);
      at::Tensor b = reordered.narrow(0, new_cu[i], n);
      const double diff = (a - b).abs().max().item<double>();
      std::printf("%s document %zu: max |difference| across packings %.3g\n", family.c_str(),
                  order[i], diff);
      EXPECT_TRUE(at::allclose(a, b, /*rtol=*/1e-6, /*atol=*/1e-6))
          << family << " document " << order[i] << " differs by " << diff;
    }
  }
}

TEST_F(TargetModelTest, TiedAndUntiedHeads) {
  auto qwen = TargetModel::Load((Dir() / "qwen3").string(), Fp32());
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE((*qwen)->lm_head().is_same((*qwen)->embed_tokens()));
  auto llama = TargetModel::Load((Dir() / "llama").string(), Fp32({0}));
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_FALSE((*llama)->lm_head().is_same((*llama)->embed_tokens()));
  EXPECT_EQ((*llama)->lm_head().sizes(), (*llama)->embed_tokens().sizes());
  EXPECT_FALSE(at::equal((*llama)->lm_head(), (*llama)->embed_tokens()));
}

TEST_F(TargetModelTest, WrongShapeNamesTensorAndFile) {
  auto model = TargetModel::Load((Dir() / "qwen3_bad_shape").string(), Fp32());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(model.status().message());
  EXPECT_NE(msg.find("model.layers.1.self_attn.k_proj.weight: shape [16, 64]"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("expected [32, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("qwen3_bad_shape/model.safetensors"), std::string::npos) << msg;
}

TEST_F(TargetModelTest, MissingTensorIsNamed) {
  auto model = TargetModel::Load((Dir() / "qwen3_missing").string(), Fp32());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find("model.layers.2.mlp.up_proj.weight"),
            absl::string_view::npos)
      << model.status();
}

TEST_F(TargetModelTest, IntegerWeightInTheFileIsRefusedByName) {
  // The Qwen3 checkpoint with one projection stored as I32: a dtype no config expects.
  const fs::path dir =
      fs::temp_directory_path() / ("dflash-int-weight-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::copy_file(Dir() / "qwen3" / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  std::map<std::string, at::Tensor> tensors = ReadAll(Dir() / "qwen3" / "model.safetensors");
  ASSERT_FALSE(tensors.empty());
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  ASSERT_EQ(tensors.count(name), 1u);
  tensors[name] = tensors[name].to(at::kInt).contiguous();
  std::vector<model::TensorToWrite> out;
  for (const auto& [n, t] : tensors) {
    at::Tensor c = t.contiguous();
    tensors[n] = c;
    const model::DType dtype =
        c.scalar_type() == at::kInt ? model::DType::kI32 : model::DType::kF32;
    ASSERT_TRUE(c.scalar_type() == at::kInt || c.scalar_type() == at::kFloat) << n;
    out.push_back({n, dtype, c.sizes().vec(), c.data_ptr(), c.nbytes()});
  }
  ASSERT_TRUE(model::WriteSafetensors((dir / "model.safetensors").string(), out, {}).ok());
  auto model = TargetModel::Load(dir.string(), Fp32());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(model.status().message());
  EXPECT_NE(msg.find(name + ": dtype I32 in " + (dir / "model.safetensors").string() +
                     ", expected a floating-point weight"),
            std::string::npos)
      << msg;
  fs::remove_all(dir);
}

TEST_F(TargetModelTest, RejectsLayerIdOutsideModel) {
  auto model = TargetModel::Load((Dir() / "qwen3").string(), Fp32({1, 8}));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("8"), absl::string_view::npos) << model.status();
}

TEST_F(TargetModelTest, RejectsMalformedInputs) {
  auto model = TargetModel::Load((Dir() / "llama").string(), Fp32({0}));
  ASSERT_TRUE(model.ok()) << model.status();
  auto refs = ReadAll(Dir() / "llama_refs.safetensors");
  const at::Tensor& ids = refs["input_ids"];
  const at::Tensor& pos = refs["positions"];
  const at::Tensor& cu = refs["cu_seqlens"];
  const auto int32 = at::TensorOptions().dtype(at::kInt);
  const std::vector<std::pair<std::string, absl::Status>> cases = {
      {"cu_seqlens short of T",
       (*model)->Forward(ids, pos, at::tensor(std::vector<int32_t>{0, 3}, int32)).status()},
      {"cu_seqlens decreasing",
       (*model)
           ->Forward(ids, pos,
                     at::tensor(std::vector<int32_t>{0, 20, 10, static_cast<int32_t>(ids.size(0))},
                                int32))
           .status()},
      {"cu_seqlens int64", (*model)->Forward(ids, pos, cu.to(at::kLong)).status()},
      {"token outside vocabulary", (*model)->Forward(ids + 256, pos, cu).status()},
      {"positions length", (*model)->Forward(ids, pos.narrow(0, 0, 3), cu).status()},
      {"features shape", (*model)->Forward(ids, pos, cu, at::empty({ids.size(0), 7}, at::kFloat))},
  };
  for (const auto& [what, status] : cases) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
  }
}

// FromTensors builds the same model as Load from the checkpoint's tensors held in memory, needs
// only the tensors that Forward uses, and names a missing or misshapen one.
TEST_F(TargetModelTest, FromTensorsMatchesLoad) {
  auto refs = ReadAll(Dir() / "qwen3_refs.safetensors");
  auto config = model::LoadHfConfig((Dir() / "qwen3").string());
  ASSERT_TRUE(config.ok()) << config.status();
  std::map<std::string, at::Tensor> tensors = ReadAll(Dir() / "qwen3" / "model.safetensors");
  const std::vector<int64_t> ids = {3, 1};
  auto loaded = TargetModel::Load((Dir() / "qwen3").string(), Fp32(ids));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // Layers after the last captured one (3) and the final norm are never read.
  for (auto it = tensors.begin(); it != tensors.end();) {
    const bool unused = it->first.rfind("model.layers.4.", 0) == 0 ||
                        it->first.rfind("model.layers.7.", 0) == 0 ||
                        it->first == "model.norm.weight";
    it = unused ? tensors.erase(it) : std::next(it);
  }
  auto built = TargetModel::FromTensors(*config, tensors, Fp32(ids));
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ((*built)->layer_ids(), ids);
  EXPECT_TRUE((*built)->lm_head().is_same((*built)->embed_tokens()));
  auto a = (*loaded)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
  auto b = (*built)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(*a, *b));

  auto bad = tensors;
  bad.erase("model.layers.2.self_attn.v_proj.weight");
  auto missing = TargetModel::FromTensors(*config, bad, Fp32(ids));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("model.layers.2.self_attn.v_proj.weight"),
            absl::string_view::npos)
      << missing.status();
  bad = tensors;
  bad["model.layers.0.mlp.down_proj.weight"] = at::randn({64, 64});
  auto shape = TargetModel::FromTensors(*config, bad, Fp32(ids));
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument) << shape.status();
  EXPECT_NE(shape.status().message().find(
                "model.layers.0.mlp.down_proj.weight: shape [64, 64], expected [64, 128]"),
            absl::string_view::npos)
      << shape.status();
}

// The CPU reference against LibTorch's SDPA, per document, with GQA and an empty document.
TEST(VarlenAttentionTest, ReferenceMatchesSdpaPerDocument) {
  const std::vector<int32_t> cu = {0, 7, 7, 20, 21};
  const int64_t t = cu.back(), hq = 6, hkv = 2, d = 8;
  at::Tensor q = at::randn({t, hq, d}), k = at::randn({t, hkv, d}), v = at::randn({t, hkv, d});
  at::Tensor out =
      VarlenCausalAttention(q, k, v, at::tensor(cu, at::TensorOptions().dtype(at::kInt)), 0.3);
  ASSERT_EQ(out.sizes(), q.sizes());
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int64_t n = cu[i + 1] - cu[i];
    if (n == 0) continue;
    auto heads_first = [&](const at::Tensor& x) {
      return x.narrow(0, cu[i], n).transpose(0, 1).unsqueeze(0);
    };
    at::Tensor want = at::scaled_dot_product_attention(heads_first(q), heads_first(k),
                                                       heads_first(v), {}, 0.0, true, 0.3, true)
                          .squeeze(0)
                          .transpose(0, 1);
    EXPECT_LT(RelError(out.narrow(0, cu[i], n), want), 1e-5) << "document " << i;
  }
}

}  // namespace
}  // namespace dflash::nn

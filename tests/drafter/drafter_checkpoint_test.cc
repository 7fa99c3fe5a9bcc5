// The drafter's serving checkpoint (method.md §7): export -> import round trip, the config.json
// fields, the tensor list, atomic publication, and the errors of import.
#include "common/drafter/drafter_checkpoint.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/model/hf_config.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/common/read_file.h"
#include "tests/drafter/test_util.h"

namespace dflash::drafter {
namespace {

namespace fs = std::filesystem;
using testing::MakeModel;
using testing::ScopedDir;
using testing::TinyConfig;

std::string ReadText(const fs::path& path) { return dflash::testing::ReadFileText(path.string()); }

ExportOptions Fp32() {
  ExportOptions o;
  o.dtype = model::DType::kF32;
  return o;
}

// A copy of checkpoint `src` under `dst` whose tensors went through `edit` (fp32).
void WriteVariant(const fs::path& src, const fs::path& dst,
                  const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
  fs::create_directories(dst);
  fs::copy_file(src / "config.json", dst / "config.json", fs::copy_options::overwrite_existing);
  std::map<std::string, at::Tensor> tensors = testing::ReadAll(src / "model.safetensors");
  edit(tensors);
  std::vector<model::TensorToWrite> out;
  for (auto& [name, t] : tensors) {
    t = t.contiguous();
    out.push_back({name, model::DType::kF32, t.sizes().vec(), t.data_ptr(), t.nbytes()});
  }
  ASSERT_TRUE(model::WriteSafetensors((dst / "model.safetensors").string(), out, {}).ok());
}

TEST(DrafterCheckpointTest, Fp32RoundTripIsBitExact) {
  auto a = MakeModel(TinyConfig(), 11);
  auto b = MakeModel(TinyConfig(), 12);
  ASSERT_TRUE(a && b);
  const ScopedDir tmp("roundtrip");
  const fs::path dir = tmp.path() / "ckpt";
  ASSERT_TRUE(ExportDrafter(*a, dir.string(), Fp32()).ok());
  ASSERT_FALSE(at::equal(a->parameters()[0].tensor, b->parameters()[0].tensor));
  absl::Status s = ImportDrafter(dir.string(), b.get());
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(a->parameters().size(), b->parameters().size());
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(a->parameters()[i].tensor, b->parameters()[i].tensor))
        << a->parameters()[i].name;
    EXPECT_TRUE(b->parameters()[i].tensor.requires_grad()) << b->parameters()[i].name;
  }
}

TEST(DrafterCheckpointTest, Bf16ExportHoldsRoundedWeights) {
  auto a = MakeModel(TinyConfig(), 5);
  ASSERT_TRUE(a);
  const ScopedDir tmp("bf16");
  const fs::path dir = tmp.path() / "ckpt";
  ASSERT_TRUE(ExportDrafter(*a, dir.string()).ok());  // bf16 by default
  auto file = model::SafetensorsFile::Open((dir / "model.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  for (const model::TensorInfo& info : (*file)->header().tensors) {
    EXPECT_EQ(info.dtype, model::DType::kBF16) << info.name;
  }
  auto stored = testing::ReadAll(dir / "model.safetensors");
  for (const NamedParameter& p : a->parameters()) {
    EXPECT_TRUE(at::equal(stored[p.name], p.tensor.detach().to(at::kBFloat16))) << p.name;
  }
  auto config = model::LoadHfConfig(dir.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->torch_dtype, "bfloat16");
}

// config.json parses with ParseHfConfig and carries the §7 fields; model.safetensors holds exactly
// the §7 tensors.
TEST(DrafterCheckpointTest, ServingFormat) {
  DrafterConfig c = TinyConfig();
  c.target.rope_scaling = model::RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192};
  c.target.rope_theta = 500000.0;
  auto m = MakeModel(c, 1);
  ASSERT_TRUE(m);
  const ScopedDir tmp("format");
  const fs::path dir = tmp.path() / "ckpt";
  ASSERT_TRUE(ExportDrafter(*m, dir.string()).ok());
  const std::string text = ReadText(dir / "config.json");
  auto parsed = model::ParseHfConfig(text, "config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->architectures, std::vector<std::string>{"DFlashDraftModel"});
  EXPECT_EQ(parsed->model_type, "qwen3");
  EXPECT_EQ(parsed->num_hidden_layers, 2);
  EXPECT_EQ(parsed->block_size, 4);
  EXPECT_EQ(parsed->num_target_layers, 8);
  EXPECT_EQ(parsed->mask_token_id, 255);
  EXPECT_EQ(parsed->target_layer_ids, (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(parsed->hidden_size, 64);
  EXPECT_EQ(parsed->intermediate_size, 128);
  EXPECT_EQ(parsed->num_attention_heads, 4);
  EXPECT_EQ(parsed->num_key_value_heads, 2);
  EXPECT_EQ(parsed->head_dim, 16);
  EXPECT_EQ(parsed->vocab_size, 256);
  EXPECT_EQ(parsed->rms_norm_eps, 1e-6);
  EXPECT_EQ(parsed->rope_theta, 500000.0);
  ASSERT_TRUE(parsed->rope_scaling.has_value());
  EXPECT_EQ(parsed->rope_scaling->factor, 8.0);
  EXPECT_FALSE(parsed->tie_word_embeddings);
  const nlohmann::json raw = nlohmann::json::parse(text);
  EXPECT_EQ(raw.at("dflash_config").at("mask_token_id"), 255);
  // The reference inference package reads dflash_config.block_size first; older readers the
  // top-level key. Both are written, equal.
  EXPECT_EQ(raw.at("dflash_config").at("block_size"), 4);
  EXPECT_EQ(raw.at("block_size"), 4);

  auto back = ReadDrafterConfig(dir.string());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->target.num_hidden_layers, 8);
  EXPECT_EQ(back->num_layers, 2);

  auto ckpt = model::Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::set<std::string> want;
  for (const NamedParameter& p : ParameterSpecs(c)) want.insert(p.name);
  const std::vector<std::string> names = (*ckpt)->TensorNames();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want);
  EXPECT_EQ(want.size(), 3u + 11u * 2u);
  EXPECT_TRUE(want.count("fc.weight") && want.count("layers.1.self_attn.k_norm.weight"));
  EXPECT_FALSE(want.count("embed_tokens.weight") || want.count("lm_head.weight"));
  auto fc = (*ckpt)->Get("fc.weight");
  ASSERT_TRUE(fc.ok());
  EXPECT_EQ(fc->info->shape, (std::vector<int64_t>{64, 3 * 64}));
}

// Sliding layers (method.md §2.1) are written as the serving format has them and read back.
TEST(DrafterCheckpointTest, SlidingLayersRoundTrip) {
  DrafterConfig c = TinyConfig();
  c.layer_types = {"sliding_attention", "full_attention"};
  c.sliding_window = 5;
  auto m = MakeModel(c, 1);
  ASSERT_TRUE(m);
  const ScopedDir tmp("sliding");
  const fs::path dir = tmp.path() / "ckpt";
  ASSERT_TRUE(ExportDrafter(*m, dir.string(), Fp32()).ok());
  const nlohmann::json raw = nlohmann::json::parse(ReadText(dir / "config.json"));
  EXPECT_EQ(raw.at("layer_types"), (nlohmann::json{"sliding_attention", "full_attention"}));
  EXPECT_EQ(raw.at("sliding_window"), 5);
  EXPECT_EQ(raw.at("use_sliding_window"), true);
  auto back = ReadDrafterConfig(dir.string());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layer_types, c.layer_types);
  EXPECT_EQ(back->sliding_window, 5);
  EXPECT_TRUE(back->target.layer_types.empty());
  auto again = MakeModel(c, 2);
  ASSERT_TRUE(ImportDrafter(dir.string(), again.get()).ok());
  // A model of other layer types or another window refuses the checkpoint, naming the field.
  DrafterConfig full = TinyConfig();
  auto other = MakeModel(full, 2);
  EXPECT_THAT(std::string(ImportDrafter(dir.string(), other.get()).message()),
              ::testing::HasSubstr("layer_types"));
  c.sliding_window = 6;
  auto wider = MakeModel(c, 2);
  EXPECT_THAT(std::string(ImportDrafter(dir.string(), wider.get()).message()),
              ::testing::HasSubstr("sliding_window"));
}

TEST(DrafterCheckpointTest, ExportIsAtomicAndRefusesToClobber) {
  auto a = MakeModel(TinyConfig(), 1);
  auto b = MakeModel(TinyConfig(), 2);
  ASSERT_TRUE(a && b);
  const ScopedDir tmp("atomic");
  const fs::path parent = tmp.path();
  const fs::path dir = parent / "ckpt";
  ASSERT_TRUE(ExportDrafter(*a, dir.string(), Fp32()).ok());
  absl::Status again = ExportDrafter(*b, dir.string(), Fp32());
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  ExportOptions overwrite = Fp32();
  overwrite.overwrite = true;
  ASSERT_TRUE(ExportDrafter(*b, dir.string(), overwrite).ok());
  auto stored = testing::ReadAll(dir / "model.safetensors");
  EXPECT_TRUE(at::equal(stored["norm.weight"], b->parameters().back().tensor.detach()));
  EXPECT_TRUE(at::equal(stored["fc.weight"], b->parameters()[0].tensor.detach()));
  // Nothing but the checkpoint is left in the parent: no temporary or set-aside directories.
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(parent)) entries.push_back(e.path().filename());
  EXPECT_EQ(entries, std::vector<std::string>{"ckpt"});
}

class ImportErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = MakeModel(TinyConfig(), 4);
    ASSERT_TRUE(model_);
    root_ = tmp_.path();
    good_ = root_ / "good";
    ASSERT_TRUE(ExportDrafter(*model_, good_.string(), Fp32()).ok());
  }
  absl::Status ImportVariant(const std::string& name,
                             const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
    WriteVariant(good_, root_ / name, edit);
    return ImportDrafter((root_ / name).string(), model_.get());
  }
  ScopedDir tmp_{"import"};
  std::unique_ptr<DrafterModel> model_;
  fs::path root_, good_;
};

TEST_F(ImportErrorTest, WrongShapeNamesTensorAndFile) {
  absl::Status s = ImportVariant("bad_shape", [](auto& t) {
    t["layers.1.self_attn.k_proj.weight"] = at::randn({16, 64});
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::string msg(s.message());
  EXPECT_NE(msg.find("'layers.1.self_attn.k_proj.weight' has shape [16, 64], expected [32, 64]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("bad_shape/model.safetensors"), std::string::npos) << msg;
}

TEST_F(ImportErrorTest, MissingTensorIsNamed) {
  absl::Status s =
      ImportVariant("missing", [](auto& t) { t.erase("layers.0.mlp.up_proj.weight"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("'layers.0.mlp.up_proj.weight'"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("missing/model.safetensors"), absl::string_view::npos) << s;
}

TEST_F(ImportErrorTest, ExtraTensorIsNamed) {
  absl::Status s = ImportVariant("extra", [](auto& t) {
    t["lm_head.weight"] = at::randn({256, 64});
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("unexpected tensor 'lm_head.weight'"), absl::string_view::npos) << s;
}

TEST_F(ImportErrorTest, NothingIsLoadedOnError) {
  const at::Tensor before = model_->parameters()[0].tensor.detach().clone();
  absl::Status s = ImportVariant("late_error", [](auto& t) {
    t["fc.weight"] = t["fc.weight"] + 1.0;  // would load first ...
    t.erase("norm.weight");                 // ... but the last tensor is missing
  });
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(at::equal(before, model_->parameters()[0].tensor.detach()));
}

TEST_F(ImportErrorTest, MismatchedConfigNamesTheField) {
  struct Case {
    std::string field;
    std::function<void(DrafterConfig&)> edit;
  };
  const std::vector<Case> cases = {
      {"hidden_size", [](DrafterConfig& c) { c.target.hidden_size = 32; }},
      {"num_key_value_heads", [](DrafterConfig& c) { c.target.num_key_value_heads = 4; }},
      {"block_size", [](DrafterConfig& c) { c.block_size = 8; }},
      {"num_hidden_layers", [](DrafterConfig& c) { c.num_layers = 3; }},
      {"target_layer_ids",
       [](DrafterConfig& c) {
         c.target_layer_ids = {1, 3, 6};
       }},
      {"mask_token_id", [](DrafterConfig& c) { c.mask_token_id = 0; }},
      {"rope_theta", [](DrafterConfig& c) { c.target.rope_theta = 1e6; }},
  };
  for (const Case& tc : cases) {
    DrafterConfig c = TinyConfig();
    tc.edit(c);
    auto other = MakeModel(c, 1);
    ASSERT_TRUE(other) << tc.field;
    absl::Status s = ImportDrafter(good_.string(), other.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << tc.field << ": " << s;
    EXPECT_NE(s.message().find(tc.field), absl::string_view::npos) << tc.field << ": " << s;
    EXPECT_NE(s.message().find("good/config.json"), absl::string_view::npos) << s;
  }
}

// The block size from either place: dflash_config.block_size alone (the reference package's
// configs), the top-level key alone (exports before dflash_config had it); two different values
// are refused naming the field.
TEST(DrafterCheckpointTest, BlockSizeEitherPlace) {
  auto m = MakeModel(TinyConfig(), 1);
  ASSERT_TRUE(m);
  const ScopedDir tmp("blocksize");
  const fs::path dir = tmp.path() / "ckpt";
  ASSERT_TRUE(ExportDrafter(*m, dir.string()).ok());
  const nlohmann::json exported = nlohmann::json::parse(ReadText(dir / "config.json"));

  nlohmann::json nested_only = exported;
  nested_only.erase("block_size");
  nested_only["dflash_config"]["block_size"] = 6;
  auto a = model::ParseHfConfig(nested_only.dump(), "config.json");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->block_size, 6);

  nlohmann::json top_only = exported;
  top_only["dflash_config"].erase("block_size");
  auto b = model::ParseHfConfig(top_only.dump(), "config.json");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->block_size, 4);

  nlohmann::json neither = top_only;
  neither.erase("block_size");
  EXPECT_FALSE(model::ParseHfConfig(neither.dump(), "config.json").ok());

  nlohmann::json differ = exported;
  differ["dflash_config"]["block_size"] = 8;
  auto d = model::ParseHfConfig(differ.dump(), "config.json");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              ::testing::HasSubstr("dflash_config.block_size: 8 differs from the top-level "
                                   "block_size 4"));
}

}  // namespace
}  // namespace dflash::drafter

#include "tests/drafter/test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/model/safetensors.h"
#include "common/nn/weights.h"
#include "tests/common/max_rel_error.h"
#include "tests/common/read_file.h"

namespace dflash::drafter::testing {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& path) { return dflash::testing::ReadFileText(path.string()); }

void RemoveTree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);  // safe with LibTorch linked: see cmake/DflashHelpers.cmake
}

}  // namespace

fs::path ReferenceDir(std::string* error) {
  const fs::path dir = DFLASH_DRAFTER_REFERENCE_DIR;
  const std::string key =
      ReadText(DFLASH_DRAFTER_REFERENCE_SCRIPT) + "\npython: " + std::string(DFLASH_PYTHON);
  fs::create_directories(dir.parent_path());
  const std::string lock_path = dir.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    *error = "cannot lock " + lock_path;
    if (lock >= 0) ::close(lock);
    return {};
  }
  if (ReadText(dir / "stamp") != key) {
    RemoveTree(dir);
    fs::create_directories(dir);
    const fs::path log = dir / "reference.log";
    const std::string cmd = "'" + std::string(DFLASH_PYTHON) +
                            "' '" DFLASH_DRAFTER_REFERENCE_SCRIPT "' --out '" + dir.string() +
                            "' >'" + log.string() + "' 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      *error = "dflash_reference.py failed (" + cmd + "):\n" + ReadText(log);
    } else {
      std::ofstream(dir / "stamp", std::ios::binary) << key;
    }
  }
  ::close(lock);  // releases the flock
  return error->empty() ? dir : fs::path();
}

std::map<std::string, at::Tensor> ReadAll(const fs::path& path) {
  auto tensors = nn::ReadTensorFile(path.string());
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  return tensors.ok() ? *std::move(tensors) : std::map<std::string, at::Tensor>();
}

std::string ReadMetadata(const fs::path& path, const std::string& key) {
  auto file = model::SafetensorsFile::Open(path.string());
  if (!file.ok()) return "";
  auto it = (*file)->header().metadata.find(key);
  return it == (*file)->header().metadata.end() ? "" : it->second;
}

double MaxRelError(const at::Tensor& a, const at::Tensor& b) {
  return dflash::testing::MaxRelError(a, b);
}

DrafterConfig TinyConfig() {
  DrafterConfig c;
  model::TransformerConfig& t = c.target;
  t.model_type = "qwen3";
  t.vocab_size = 256;
  t.hidden_size = 64;
  t.intermediate_size = 128;
  t.num_hidden_layers = 8;
  t.num_attention_heads = 4;
  t.num_key_value_heads = 2;
  t.head_dim = 16;
  t.max_position_embeddings = 512;
  t.rms_norm_eps = 1e-6;
  t.rope_theta = 10000.0;
  t.qk_norm = true;
  c.num_layers = 2;
  c.block_size = 4;
  c.mask_token_id = 255;
  c.target_layer_ids = {1, 3, 5};
  return c;
}

std::unique_ptr<DrafterModel> MakeModel(const DrafterConfig& config, uint64_t seed,
                                        DrafterOptions options) {
  options.seed = seed;
  options.init_std = 0.2;  // larger than the training default, so that every path shows in outputs
  const int64_t v = config.target.vocab_size, h = config.target.hidden_size;
  at::Generator gen = at::detail::createCPUGenerator(seed + 1000);
  at::Tensor embed = at::randn({v, h}, gen, at::kFloat);
  at::Tensor lm_head = at::randn({v, h}, gen, at::kFloat) * 0.125;
  auto model = DrafterModel::Create(config, options, embed, lm_head);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

ScopedDir::ScopedDir(const std::string& name) {
  std::string tmpl = (fs::path(::testing::TempDir()) / (name + "-XXXXXX")).string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl;
  path_ = tmpl;
}

ScopedDir::~ScopedDir() { RemoveTree(path_); }

}  // namespace dflash::drafter::testing

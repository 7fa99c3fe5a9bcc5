#include "tests/nn/oracle.h"

#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/model/safetensors.h"
#include "common/nn/weights.h"
#include "tests/common/python_oracle.h"
#include "tests/common/read_file.h"

namespace dflash::nn::oracle {
namespace fs = std::filesystem;

fs::path OracleDir() { return fs::path(DFLASH_NN_ORACLE_DIR); }

std::string GenerateOracleOutputs() {
  return dflash::testing::RunPythonOracleOnce(DFLASH_PYTHON, DFLASH_NN_ORACLE_SCRIPT, OracleDir());
}

fs::path Qwen35OracleDir() { return fs::path(DFLASH_NN_QWEN35_ORACLE_DIR); }

std::string GenerateQwen35OracleOutputs() {
  // The script imports hf_oracle.py (its configs, weights and generations): a change there must
  // regenerate these outputs too.
  return dflash::testing::RunPythonOracleOnce(
      DFLASH_PYTHON, DFLASH_NN_QWEN35_ORACLE_SCRIPT, Qwen35OracleDir(), "",
      dflash::testing::ReadFileText(DFLASH_NN_ORACLE_SCRIPT));
}

fs::path RealModelDir() {
  const char* models = std::getenv("DFLASH_MODELS");
  const char* home = std::getenv("HOME");
  const fs::path parent =
      models != nullptr && *models != '\0'
          ? fs::path(models)
          : fs::path(home != nullptr ? home : "") / ".local/share/dflash/models";
  return parent / "SmolLM2-135M-Instruct";
}

fs::path RealOracleDir() { return fs::path(DFLASH_NN_REAL_ORACLE_DIR); }

std::string GenerateRealOracleOutputs() {
  const fs::path dir = RealModelDir();
  const fs::path weights = dir / "model.safetensors";
  std::error_code ec;
  if (!fs::exists(dir / "config.json", ec) || !fs::exists(weights, ec)) {
    return "the real model checkpoint is missing: " + dir.string() +
           " holds no config.json and model.safetensors; scripts/setup.sh (or "
           "scripts/models/smollm2.sh) creates it, under $DFLASH_MODELS when set";
  }
  const auto size = fs::file_size(weights, ec);
  const auto mtime = fs::last_write_time(weights, ec).time_since_epoch().count();
  const std::string key = weights.string() + " " + std::to_string(size) + " bytes, time " +
                          std::to_string(mtime) + "\n" +
                          dflash::testing::ReadFileText((dir / "config.json").string());
  return dflash::testing::RunPythonOracleOnce(DFLASH_PYTHON, DFLASH_NN_REAL_ORACLE_SCRIPT,
                                              RealOracleDir(), "--model '" + dir.string() + "'",
                                              key);
}

std::map<std::string, at::Tensor> ReadAll(const fs::path& path) {
  auto tensors = ReadTensorFile(path.string());
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  return tensors.ok() ? *std::move(tensors) : std::map<std::string, at::Tensor>();
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).to(at::kCPU).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

double RelError(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.to(at::kCPU, at::kFloat), w = want.to(at::kCPU, at::kFloat);
  return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
}

}  // namespace dflash::nn::oracle

#include "tests/nn/oracle.h"

#include <ATen/TensorOperators.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/model/safetensors.h"
#include "common/nn/weights.h"
#include "tests/common/read_file.h"

namespace dflash::nn::oracle {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& path) { return dflash::testing::ReadFileText(path.string()); }

}  // namespace

fs::path OracleDir() { return fs::path(DFLASH_NN_ORACLE_DIR); }

std::string GenerateOracleOutputs() {
  const fs::path dir = OracleDir();
  const std::string key =
      ReadText(DFLASH_NN_ORACLE_SCRIPT) + "\npython: " + std::string(DFLASH_PYTHON);
  fs::create_directories(dir.parent_path());
  const std::string lock_path = dir.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) return "cannot lock " + lock_path;
  std::string error;
  if (ReadText(dir / "stamp") != key) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path log = dir / "oracle.log";
    const std::string cmd = "'" + std::string(DFLASH_PYTHON) +
                            "' '" DFLASH_NN_ORACLE_SCRIPT "' --out '" + dir.string() + "' >'" +
                            log.string() + "' 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      error = "hf_oracle.py failed (" + cmd + "):\n" + ReadText(log);
    } else {
      std::ofstream(dir / "stamp", std::ios::binary) << key;
    }
  }
  ::close(lock);  // releases the flock
  return error;
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

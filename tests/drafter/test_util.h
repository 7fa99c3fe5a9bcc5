// Shared helpers of the drafter tests: the Python reference's files, tiny configs, error metrics.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "common/drafter/drafter_model.h"

namespace dflash::drafter::testing {

// Runs dflash_reference.py once per build tree and script version (guarded by an flock, keyed by
// a stamp holding the script text and the interpreter) and returns its output directory, or ""
// with *error set.
std::filesystem::path ReferenceDir(std::string* error);

// Tensors of a safetensors file as CPU tensors in their stored dtype.
std::map<std::string, at::Tensor> ReadAll(const std::filesystem::path& path);
// The "__metadata__" entry `key` of a safetensors file ("" when absent).
std::string ReadMetadata(const std::filesystem::path& path, const std::string& key);

// max |a - b| / max |b| (0 when both are zero); fp64 arithmetic.
double MaxRelError(const at::Tensor& a, const at::Tensor& b);

// A tiny Qwen3-shaped target (H=64, 4 heads, 2 kv heads, head_dim 16, I=128, 8 layers, V=256) with
// a 2-layer drafter, K=3, B=4, mask id 255: the reference script's shapes.
DrafterConfig TinyConfig();

// A model of TinyConfig (or `config`) with seeded random weights and random frozen embed/lm_head;
// `options` but for its seed and init_std.
std::unique_ptr<DrafterModel> MakeModel(const DrafterConfig& config, uint64_t seed,
                                        DrafterOptions options = {});

// A fresh empty directory under the test temp dir, removed with everything in it on destruction.
class ScopedDir {
 public:
  explicit ScopedDir(const std::string& name);
  ~ScopedDir();
  ScopedDir(const ScopedDir&) = delete;
  ScopedDir& operator=(const ScopedDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace dflash::drafter::testing

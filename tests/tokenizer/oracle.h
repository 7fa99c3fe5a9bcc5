// The outputs of tokenizers_oracle.py (tokenizer files and HF reference tokenizations), generated
// once per build tree and script version. Compiled with DFLASH_PYTHON,
// DFLASH_TOKENIZER_ORACLE_SCRIPT and DFLASH_TOKENIZER_ORACLE_DIR defined.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dflash::tokenizer::oracle {

std::filesystem::path OracleDir();

// Runs tokenizers_oracle.py unless the output directory's stamp (script text and interpreter)
// matches; test processes serialize on an flock. Returns "" on success, else the error with the
// script's output.
std::string GenerateOracleOutputs();

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decode;
  std::string decode_skip;
  bool decode_only = false;  // random ids to decode; `text` is empty
};

// Reads <variant>/cases.jsonl; "" on success, else the error.
std::string ReadCases(const std::string& variant, std::vector<Case>* cases);

// Reads numeric.json: the code points HF's Digits pre-tokenizer splits off.
std::string ReadNumericCodePoints(std::vector<char32_t>* code_points);

// A printable, escaped form of `s` for failure messages ("a\n\u00a0"), truncated to `max` bytes.
std::string Repr(const std::string& s, size_t max = 200);

}  // namespace dflash::tokenizer::oracle

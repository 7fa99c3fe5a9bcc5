#include "tests/tokenizer/oracle.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/common/python_oracle.h"
#include "tests/common/read_file.h"

namespace dflash::tokenizer::oracle {
namespace fs = std::filesystem;

fs::path OracleDir() { return fs::path(DFLASH_TOKENIZER_ORACLE_DIR); }

std::string GenerateOracleOutputs() {
  return dflash::testing::RunPythonOracleOnce(DFLASH_PYTHON, DFLASH_TOKENIZER_ORACLE_SCRIPT,
                                              OracleDir());
}

std::string ReadCases(const std::string& variant, std::vector<Case>* cases) {
  const fs::path path = OracleDir() / variant / "cases.jsonl";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open " + path.string();
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return path.string() + ":" + std::to_string(n) + ": not a JSON object";
    }
    cases->push_back({j.at("text").get<std::string>(), j.at("ids").get<std::vector<int32_t>>(),
                      j.at("decode").get<std::string>(), j.at("decode_skip").get<std::string>(),
                      j.value("decode_only", false)});
  }
  return cases->empty() ? path.string() + ": no cases" : "";
}

std::string ReadNumericCodePoints(std::vector<char32_t>* code_points) {
  const fs::path path = OracleDir() / "numeric.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open " + path.string();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array() || j.empty()) return path.string() + ": expected a non-empty array";
  for (const auto& v : j) code_points->push_back(v.get<char32_t>());
  return "";
}

std::string Repr(const std::string& s, size_t max) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[8];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7F) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "\"";
}

}  // namespace dflash::tokenizer::oracle

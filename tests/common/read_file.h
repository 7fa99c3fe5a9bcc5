// Whole-file reads for tests (oracle stamps, logs, config files).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace dflash::testing {

// The file's bytes, or "" when it cannot be read.
inline std::string ReadFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace dflash::testing

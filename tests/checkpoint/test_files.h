// Helpers for checkpoint tests: a temporary directory and raw safetensors bytes built by hand, so
// that tests can write files the writer would never produce.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace dflash::model::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dflash_ckpt_XXXXXX").string();
    char* dir = mkdtemp(tmpl.data());
    EXPECT_NE(dir, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// 8-byte little-endian length `header_len` (the header's real length unless overridden), the
// header text, then `data_bytes` bytes of data (0, 1, 2, ...).
inline std::string RawSafetensors(const std::string& header, uint64_t data_bytes,
                                  int64_t header_len = -1) {
  uint64_t n = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header;
  for (uint64_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i & 0xff));
  return out;
}

}  // namespace dflash::model::testing

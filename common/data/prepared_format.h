// Byte layout of the prepared data set header (see prepared.h for the whole file). Shared by the
// writer and the reader (prepared.cc) and by tests that craft or corrupt headers on purpose.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace dflash::data::prepared_format {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "prepared data sets are mapped in place and are little-endian");

// Byte offsets of the header fields.
inline constexpr size_t kMagic = 0;         // char[8]
inline constexpr size_t kVersion = 8;       // u32
inline constexpr size_t kHeaderBytes = 12;  // u32
inline constexpr size_t kFileBytes = 16;    // u64
inline constexpr size_t kFingerprint = 24;  // char[80]
inline constexpr size_t kFingerprintLen = 80;
inline constexpr size_t kVocabSize = 104;     // i64
inline constexpr size_t kDataFormat = 112;    // char[16]
inline constexpr size_t kChatTemplate = 128;  // char[16]
inline constexpr size_t kNameLen = 16;
inline constexpr size_t kBlockSize = 144;      // i32 (+ u32 reserved)
inline constexpr size_t kMaxLength = 152;      // i64
inline constexpr size_t kSourceBytes = 160;    // i64
inline constexpr size_t kSourceMtimeNs = 168;  // i64
inline constexpr size_t kNumDocuments = 176;   // i64
inline constexpr size_t kNumTokens = 184;      // i64
inline constexpr size_t kNumSupervised = 192;  // i64
inline constexpr size_t kSections = 200;       // {u64 offset, u64 bytes} x kNumSections
inline constexpr size_t kNumSections = 4;
inline constexpr size_t kSourcePathBytes = 264;  // u32
inline constexpr size_t kSourcePath = 268;       // char[4096]
inline constexpr size_t kSourcePathMax = 4096;

enum Section { kTokens = 0, kLossMask = 1, kDocOffsets = 2, kReport = 3 };
inline constexpr const char* kSectionNames[kNumSections] = {"tokens", "loss_mask", "doc_offsets",
                                                            "report"};
inline constexpr uint64_t kSectionAlign = 64;

inline void PutU32(uint8_t* base, size_t at, uint32_t v) { std::memcpy(base + at, &v, 4); }
inline void PutU64(uint8_t* base, size_t at, uint64_t v) { std::memcpy(base + at, &v, 8); }
inline uint32_t GetU32(const uint8_t* base, size_t at) {
  uint32_t v;
  std::memcpy(&v, base + at, 4);
  return v;
}
inline uint64_t GetU64(const uint8_t* base, size_t at) {
  uint64_t v;
  std::memcpy(&v, base + at, 8);
  return v;
}
// Fixed-width NUL-padded text; the caller has checked that it fits.
inline void PutText(uint8_t* base, size_t at, size_t width, absl::string_view s) {
  std::memset(base + at, 0, width);
  std::memcpy(base + at, s.data(), s.size() < width ? s.size() : width);
}
inline std::string GetText(const uint8_t* base, size_t at, size_t width) {
  const char* p = reinterpret_cast<const char*>(base + at);
  return std::string(p, strnlen(p, width));
}
inline uint64_t AlignUp(uint64_t x) {
  return (x + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
}

}  // namespace dflash::data::prepared_format

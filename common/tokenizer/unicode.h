// UTF-8 and Unicode helpers for the tokenizer: validation, Rust-compatible lossy decoding, the
// character classes HF's added-token matching uses, and NFC as HF computes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dflash::tokenizer::unicode {

inline constexpr size_t kValid = static_cast<size_t>(-1);

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are ill-formed), or kValid.
size_t FindInvalidUtf8(std::string_view s);

// Decodes the code point at s[i], which must start a well-formed sequence; sets *len to its length.
inline char32_t DecodeAt(std::string_view s, size_t i, int* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    *len = 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *len = 2;
    return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    *len = 3;
    return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *len = 4;
  return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
         (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

// The code point that ends at s[end) (s[..end) well-formed, end > 0).
char32_t DecodeBefore(std::string_view s, size_t end);

void AppendUtf8(char32_t cp, std::string* out);

// Rust's String::from_utf8_lossy: each maximal ill-formed subsequence becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Unicode White_Space (what Rust's regex and Oniguruma call \s).
bool IsWhiteSpace(char32_t c);

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation, join controls.
// Alphabetic is approximated as letters, letter numbers and the non-mark Other_Alphabetic ranges
// (circled and squared Latin letters); only single_word added tokens look at it.
bool IsWordChar(char32_t c);

// NFC as HF's normalizer computes it (utf8proc, with code points HF's older tables do not know
// kept as inert starters). Input must be valid UTF-8.
std::string Nfc(std::string_view s);

}  // namespace dflash::tokenizer::unicode

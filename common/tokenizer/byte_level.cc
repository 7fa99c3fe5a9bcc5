#include "common/tokenizer/byte_level.h"

#include "common/tokenizer/unicode.h"

namespace dflash::tokenizer::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<std::string, 256> to_string;
  std::array<int16_t, 324> to_byte{};  // indexed by code point; every alphabet code point < 324
};

const Tables& GetTables() {
  static const Tables tables = [] {
    Tables t;
    t.to_byte.fill(-1);
    // bytes_to_unicode() from GPT-2's encoder.py: printable Latin-1 bytes stand for themselves,
    // the others take the code points from U+0100 upward in byte order.
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      t.to_char[b] = c;
      unicode::AppendUtf8(c, &t.to_string[b]);
      t.to_byte[c] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

char32_t ByteToChar(unsigned char b) { return GetTables().to_char[b]; }

const std::array<std::string, 256>& ByteStrings() { return GetTables().to_string; }

std::optional<std::string> ToBytes(std::string_view s) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int len;
    const char32_t c = unicode::DecodeAt(s, i, &len);
    if (c >= t.to_byte.size() || t.to_byte[c] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.to_byte[c]));
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string FromBytes(std::string_view bytes) {
  const auto& strings = GetTables().to_string;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) out += strings[static_cast<unsigned char>(b)];
  return out;
}

}  // namespace dflash::tokenizer::byte_level

#include "common/tokenizer/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/tokenizer/unicode_tables.h"

namespace dflash::tokenizer::unicode {
namespace {

// Length of the well-formed sequence at p (1-4), or minus the length of the maximal ill-formed
// subpart (Unicode's "maximal subpart" rule, which Rust's from_utf8_lossy follows).
int CheckSequence(const unsigned char* p, size_t n) {
  const unsigned char b = p[0];
  if (b < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    need = 2;
  } else if (b == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    need = 3;
  } else if (b == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= n || p[k] < lo || p[k] > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

bool InRanges(char32_t c, const tables::CodePointRange* r, size_t n) {
  const auto* end = r + n;
  const auto* it = std::upper_bound(
      r, end, c, [](char32_t v, const tables::CodePointRange& x) { return v < x.first; });
  return it != r && c <= (it - 1)->last;
}

void AppendNfcSegment(std::string_view seg, std::string* out) {
  if (seg.empty()) return;
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(seg.data()),
                   static_cast<utf8proc_ssize_t>(seg.size()), &dst,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {  // only on allocation failure: the input was validated
    out->append(seg);
    return;
  }
  out->append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs dominate real text: check eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    const int len = CheckSequence(p + i, n - i);
    if (len < 0) return i;
    i += static_cast<size_t>(len);
  }
  return kValid;
}

char32_t DecodeBefore(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  int len;
  return DecodeAt(s, start, &len);
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int len = CheckSequence(p + i, bytes.size() - i);
    if (len > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out.append("\xEF\xBF\xBD");
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

bool IsWhiteSpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;  // Other_Alphabetic symbols
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

std::string Nfc(std::string_view s) {
  // Code points below U+0300 (lead bytes below 0xCC) neither decompose nor combine with anything
  // before them, so text without a byte >= 0xCC is already NFC.
  const bool trivial = std::none_of(s.begin(), s.end(),
                                    [](char ch) { return static_cast<unsigned char>(ch) >= 0xCC; });
  if (trivial) return std::string(s);
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  // HF keeps code points its tables lack as they are, and they block composition and reordering
  // across them; so normalize the stretches between them separately.
  size_t seg = 0;
  for (size_t i = 0; i < s.size();) {
    int len;
    const char32_t c = DecodeAt(s, i, &len);
    if (c >= 0x7FD && InRanges(c, tables::kHfNfcInert, tables::kHfNfcInertSize)) {
      AppendNfcSegment(s.substr(seg, i - seg), &out);
      out.append(s.substr(i, static_cast<size_t>(len)));
      seg = i + static_cast<size_t>(len);
    }
    i += static_cast<size_t>(len);
  }
  AppendNfcSegment(s.substr(seg), &out);
  return out;
}

}  // namespace dflash::tokenizer::unicode

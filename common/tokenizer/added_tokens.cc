#include "common/tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "common/tokenizer/unicode.h"

namespace dflash::tokenizer {
namespace {

// Start of the whitespace run that ends `s` (Rust regex `\s*$`).
size_t TrailingSpaceStart(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    const char32_t c = unicode::DecodeBefore(s, i);
    if (!unicode::IsWhiteSpace(c)) break;
    i -= c < 0x80 ? 1 : (c < 0x800 ? 2 : (c < 0x10000 ? 3 : 4));
  }
  return i;
}

// Length of the whitespace run that starts `s` (Rust regex `^\s*`).
size_t LeadingSpaceLength(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int len;
    if (!unicode::IsWhiteSpace(unicode::DecodeAt(s, i, &len))) break;
    i += static_cast<size_t>(len);
  }
  return i;
}

bool EndsWithWord(std::string_view s) {
  return !s.empty() && unicode::IsWordChar(unicode::DecodeBefore(s, s.size()));
}

bool StartsWithWord(std::string_view s) {
  int len;
  return !s.empty() && unicode::IsWordChar(unicode::DecodeAt(s, 0, &len));
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<Pattern> patterns)
    : patterns_(std::move(patterns)) {
  for (size_t i = 0; i < patterns_.size(); ++i) {
    if (patterns_[i].text.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(patterns_[i].text[0])].push_back(static_cast<int>(i));
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      return patterns_[a].text.size() > patterns_[b].text.size();
    });
  }
}

int AddedTokenMatcher::FindLeftmostLongest(std::string_view s, size_t from, size_t* at) const {
  for (size_t i = from; i < s.size(); ++i) {
    const auto& candidates = by_first_byte_[static_cast<unsigned char>(s[i])];
    for (int p : candidates) {
      const std::string& text = patterns_[p].text;
      if (text.size() <= s.size() - i && std::memcmp(s.data() + i, text.data(), text.size()) == 0) {
        *at = i;
        return p;
      }
    }
  }
  return -1;
}

void AddedTokenMatcher::Split(std::string_view s, std::vector<TextSplit>* out) const {
  if (s.empty()) return;
  size_t start_offset = 0;  // end of the previous split, as HF names it
  size_t search = 0;        // where the match iterator resumes: the end of the raw match
  size_t at = 0;
  for (int p; search < s.size() && (p = FindLeftmostLongest(s, search, &at)) >= 0;) {
    const Pattern& pat = patterns_[static_cast<size_t>(p)];
    size_t start = at, stop = at + pat.text.size();
    search = stop;
    if (pat.single_word) {
      const bool start_space = start == 0 || !EndsWithWord(s.substr(0, start));
      const bool stop_space = stop == s.size() || !StartsWithWord(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (pat.lstrip) start = std::max(TrailingSpaceStart(s.substr(0, start)), start_offset);
    if (pat.rstrip) stop += LeadingSpaceLength(s.substr(stop));
    if (start_offset < start) {
      out->push_back({static_cast<uint32_t>(start_offset), static_cast<uint32_t>(start), -1});
    }
    out->push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(stop), pat.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) {
    out->push_back({static_cast<uint32_t>(start_offset), static_cast<uint32_t>(s.size()), -1});
  }
}

}  // namespace dflash::tokenizer

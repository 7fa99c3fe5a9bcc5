// Finding added tokens in text the way HF's AddedVocabulary::find_matches does: leftmost-longest,
// non-overlapping matches; single_word matches need non-word characters (or the text's ends) on
// both sides; lstrip and rstrip pull the whitespace next to a match into it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::tokenizer {

// A piece of text: an added token (id >= 0) or plain text to pre-tokenize (id < 0).
struct TextSplit {
  uint32_t start;
  uint32_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  struct Pattern {
    std::string text;  // what is matched (the normalized content for normalized tokens)
    int32_t id = 0;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
  };

  explicit AddedTokenMatcher(std::vector<Pattern> patterns);

  bool empty() const { return patterns_.empty(); }

  // Appends the splits of `s` (valid UTF-8) in order, covering it; nothing for an empty `s`.
  void Split(std::string_view s, std::vector<TextSplit>* out) const;

 private:
  // Leftmost-longest match at or after `from`: returns the pattern index and sets *at.
  int FindLeftmostLongest(std::string_view s, size_t from, size_t* at) const;

  std::vector<Pattern> patterns_;
  // Pattern indices by first byte, longest first.
  std::array<std::vector<int>, 256> by_first_byte_;
};

}  // namespace dflash::tokenizer

// The pre-tokenizer's regular expressions: Oniguruma patterns (what HF `tokenizers` runs)
// translated to PCRE2 with the same meaning, compiled with UTF, UCP and JIT.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace dflash::tokenizer {

// Rewrites an Oniguruma pattern into PCRE2 syntax with Oniguruma's meaning:
//   \s, \S        -> Unicode White_Space (PCRE2's UCP \s also takes U+180E);
//   \p{L,N,M}     -> PCRE2's class plus the code points Oniguruma's newer Unicode tables add;
//   \uHHHH        -> \x{HHHH}.
// Escapes whose meaning differs between the engines (\h \H \v \V \w \W \b \B \R \X, \S and \P
// inside a class) and nested classes are refused by name rather than approximated.
absl::StatusOr<std::string> TranslateOnigPattern(std::string_view pattern);

class Regex {
 public:
  // `pattern` is PCRE2 syntax (see TranslateOnigPattern).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each leftmost non-overlapping match in `text`, which must be
  // valid UTF-8; an empty match moves the search on by one code point, as Oniguruma's iterator
  // does. Thread-safe (match data is per thread). Returns an error only when PCRE2 fails.
  absl::Status ForEachMatch(std::string_view text,
                            absl::FunctionRef<void(size_t, size_t)> on_match) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*
};

}  // namespace dflash::tokenizer

// Python str semantics over UTF-8 strings, as chat templates use them through Jinja: code-point
// length and slicing, str.strip/lstrip/rstrip (Unicode whitespace or a set of characters),
// str.split, and the float repr. Strings are assumed to be valid UTF-8 (records are checked).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dflash::jinja::py {

// The code points of `s`.
std::vector<char32_t> Decode(absl::string_view s);
// UTF-8 of code points.
std::string Encode(const std::vector<char32_t>& cps);
void AppendUtf8(char32_t cp, std::string* out);

// Python's str.isspace() for one code point.
bool IsSpace(char32_t c);

// len(s): the number of code points.
int64_t Length(absl::string_view s);

// s.strip(chars) / lstrip / rstrip. `chars` absent: Unicode whitespace.
std::string Strip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);

// s.split(sep, maxsplit). `sep` absent: runs of whitespace, empty strings dropped. An empty `sep`
// is Python's ValueError: returns false.
bool Split(absl::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
           std::vector<std::string>* out);

// Python's slice index normalisation: the indices a[start:stop:step] visits for a sequence of
// length n (step != 0).
std::vector<int64_t> SliceIndices(int64_t n, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step);

// repr(x) for a float ("1.0", "0.1", "1e+16", "inf", "nan").
std::string FloatRepr(double x);
// repr(s) for a str ('...' with Python's escapes).
std::string StrRepr(absl::string_view s);
// json.dumps(s, ensure_ascii=False) for a str.
std::string JsonString(absl::string_view s);

// True when every byte is ASCII (case mapping is only done for ASCII text).
bool IsAscii(absl::string_view s);

}  // namespace dflash::jinja::py

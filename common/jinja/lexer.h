// Splits a Jinja template into text, {{ expression }} and {% statement %} segments, applying
// jinja2's whitespace control as transformers configures it (trim_blocks=True, lstrip_blocks=True,
// "-" and "+" modifiers), and tokenizes the inside of each tag. Comments are dropped.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dflash::jinja {

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp };
  Kind kind;
  std::string text;  // name, operator, or the decoded string literal / number text
  size_t pos;        // byte offset in the source
};

struct Segment {
  enum class Kind { kText, kExpr, kStmt };
  Kind kind;
  std::string text;           // kText
  std::vector<Token> tokens;  // kExpr, kStmt
  size_t pos;                 // byte offset of the segment (of "{{" / "{%" for tags)
  size_t end_pos;             // byte offset of the closing delimiter
};

// "name:line:col" for an offset in `source` (1-based line and column, column in code points).
std::string Where(absl::string_view name, absl::string_view source, size_t pos);

// Errors (unterminated tags, strings or comments, unknown characters) name `name`, line and column.
absl::StatusOr<std::vector<Segment>> Lex(absl::string_view name, absl::string_view source);

}  // namespace dflash::jinja

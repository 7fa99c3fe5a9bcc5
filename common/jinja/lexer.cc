#include "common/jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jinja/py_string.h"

namespace dflash::jinja {
namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Strips trailing Python whitespace (the "-" of an opening tag).
void RStripSpace(std::string* text) {
  *text = py::Strip(*text, std::nullopt, /*left=*/false, /*right=*/true);
}

class Lexer {
 public:
  Lexer(absl::string_view name, absl::string_view src) : name_(name), src_(src) {}

  absl::StatusOr<std::vector<Segment>> Run() {
    size_t i = 0;
    while (i < src_.size()) {
      const size_t open = FindOpen(i);
      AddText(src_.substr(i, open - i), i);
      if (open == src_.size()) break;
      absl::StatusOr<size_t> next = Tag(open);
      if (!next.ok()) return next.status();
      i = *next;
    }
    return std::move(out_);
  }

 private:
  absl::Status Error(size_t pos, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(Where(name_, src_, pos), ": ", what));
  }

  size_t FindOpen(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void AddText(absl::string_view text, size_t pos) {
    std::string t(text);
    if (strip_next_) {
      t = py::Strip(t, std::nullopt, /*left=*/true, /*right=*/false);
    } else if (trim_newline_ && !t.empty() && t[0] == '\n') {
      t.erase(0, 1);
    } else if (trim_newline_ && t.size() >= 2 && t[0] == '\r' && t[1] == '\n') {
      t.erase(0, 2);
    }
    strip_next_ = trim_newline_ = false;
    if (!t.empty()) out_.push_back({Segment::Kind::kText, std::move(t), {}, pos, pos});
  }

  // lstrip_blocks: a block or comment tag preceded on its line by spaces/tabs only removes them.
  void LStripBlock(size_t open) {
    size_t k = open;
    while (k > 0 && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k;
    if (k != 0 && src_[k - 1] != '\n') return;
    size_t n = open - k;
    if (out_.empty() || out_.back().kind != Segment::Kind::kText) return;
    std::string& t = out_.back().text;
    while (n > 0 && !t.empty() && (t.back() == ' ' || t.back() == '\t')) {
      t.pop_back();
      --n;
    }
    if (t.empty()) out_.pop_back();
  }

  // Handles the tag opening at `open`; returns the offset after it.
  absl::StatusOr<size_t> Tag(size_t open) {
    const char type = src_[open + 1];
    size_t i = open + 2;
    const bool strip_before = i < src_.size() && src_[i] == '-';
    const bool keep_lstrip = i < src_.size() && src_[i] == '+';
    if (strip_before || keep_lstrip) ++i;
    if (strip_before && !out_.empty() && out_.back().kind == Segment::Kind::kText) {
      RStripSpace(&out_.back().text);
      if (out_.back().text.empty()) out_.pop_back();
    } else if (type != '{' && !keep_lstrip) {
      LStripBlock(open);
    }
    if (type == '#') {
      const size_t close = src_.find("#}", i);
      if (close == absl::string_view::npos) return Error(open, "unterminated comment");
      strip_next_ = close > i && src_[close - 1] == '-';
      trim_newline_ = !strip_next_;
      return close + 2;
    }
    const absl::string_view closer = type == '{' ? "}}" : "%}";
    Segment seg{type == '{' ? Segment::Kind::kExpr : Segment::Kind::kStmt, "", {}, open, 0};
    while (true) {
      while (i < src_.size() && std::isspace(static_cast<unsigned char>(src_[i]))) ++i;
      if (i >= src_.size())
        return Error(open, absl::StrCat("unterminated tag (no '", closer, "')"));
      // "-}}" / "-%}" / "+%}" or the plain closer.
      for (const char mod : {'-', '+', '\0'}) {
        const size_t at = mod ? i + 1 : i;
        if ((mod == 0 || src_[i] == mod) && src_.substr(at, 2) == closer) {
          seg.end_pos = i;
          strip_next_ = mod == '-';
          trim_newline_ = type == '%' && mod == '\0';
          out_.push_back(std::move(seg));
          return at + 2;
        }
      }
      absl::StatusOr<size_t> next = Lex(i, &seg.tokens);
      if (!next.ok()) return next.status();
      i = *next;
    }
  }

  // One token at `i` into `tokens`; returns the offset after it.
  absl::StatusOr<size_t> Lex(size_t i, std::vector<Token>* tokens) {
    const char c = src_[i];
    if (IsNameStart(c)) {
      size_t j = i;
      while (j < src_.size() && IsNameChar(src_[j])) ++j;
      tokens->push_back({Token::Kind::kName, std::string(src_.substr(i, j - i)), i});
      return j;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_'))
        ++j;
      if (j + 1 < src_.size() && src_[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
        is_float = true;
        ++j;
        while (j < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j]))) ++j;
      }
      if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {  // 1e3, 2.5e-4
        size_t k = j + 1;
        if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
        if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
          is_float = true;
          j = k;
          while (j < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j]))) ++j;
        }
      }
      std::string text;
      for (char d : src_.substr(i, j - i)) {
        if (d != '_') text.push_back(d);
      }
      tokens->push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, i});
      return j;
    }
    if (c == '\'' || c == '"') return String(i, tokens);
    static const char* const kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                                       "-",  "*",  "/",  "%",  "~",  "|",  ".", ",", ":",
                                       "(",  ")",  "[",  "]",  "{",  "}",  "="};
    for (const char* op : kOps) {
      if (src_.substr(i, std::string_view(op).size()) == op) {
        tokens->push_back({Token::Kind::kOp, op, i});
        return i + std::string_view(op).size();
      }
    }
    return Error(i, absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  // A string literal with Python's escapes (jinja2 decodes them the same way).
  absl::StatusOr<size_t> String(size_t i, std::vector<Token>* tokens) {
    const char quote = src_[i];
    std::string value;
    size_t j = i + 1;
    while (j < src_.size() && src_[j] != quote) {
      if (src_[j] != '\\') {
        value.push_back(src_[j++]);
        continue;
      }
      if (j + 1 >= src_.size()) break;
      const char e = src_[j + 1];
      j += 2;
      switch (e) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case '\\':
        case '\'':
        case '"':
          value.push_back(e);
          break;
        case '\n':
          break;
        case 'u':
        case 'x': {
          const size_t n = e == 'u' ? 4 : 2;
          if (j + n > src_.size()) return Error(j - 2, "truncated escape in a string literal");
          const std::string hex(src_.substr(j, n));
          py::AppendUtf8(static_cast<char32_t>(std::stoul(hex, nullptr, 16)), &value);
          j += n;
          break;
        }
        default:
          return Error(j - 2, absl::StrCat("unsupported escape '\\", std::string(1, e),
                                           "' in a string literal"));
      }
    }
    if (j >= src_.size()) return Error(i, "unterminated string literal");
    tokens->push_back({Token::Kind::kString, std::move(value), i});
    return j + 1;
  }

  absl::string_view name_, src_;
  std::vector<Segment> out_;
  bool strip_next_ = false;    // "-" closed the last tag
  bool trim_newline_ = false;  // trim_blocks after a block tag or comment
};

}  // namespace

std::string Where(absl::string_view name, absl::string_view source, size_t pos) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  const size_t end = std::min(pos, source.size());
  const int64_t column = py::Length(source.substr(line_start, end - line_start)) + 1;
  return absl::StrCat(name, ":", line, ":", column);
}

absl::StatusOr<std::vector<Segment>> Lex(absl::string_view name, absl::string_view source) {
  // jinja2's keep_trailing_newline=False: one trailing newline of the source is dropped.
  if (absl::EndsWith(source, "\r\n")) {
    source.remove_suffix(2);
  } else if (absl::EndsWith(source, "\n") || absl::EndsWith(source, "\r")) {
    source.remove_suffix(1);
  }
  return Lexer(name, source).Run();
}

}  // namespace dflash::jinja

#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode_tables.h"

namespace dflash::tokenizer {
namespace {

// Unicode White_Space, as a class body.
constexpr char kWhiteSpace[] =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

const char* ExtraFor(char prop) {
  switch (prop) {
    case 'L':
      return tables::kOnigExtraLetters;
    case 'N':
      return tables::kOnigExtraNumbers;
    case 'M':
      return tables::kOnigExtraMarks;
    default:
      return nullptr;
  }
}

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state shared by every Regex: the ovector needs one pair, and the JIT stack
// grows up to 16 MiB for patterns that backtrack over long runs (50k spaces against \s+(?!\S)).
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

// Translates one escape at pattern[i] (a backslash); appends to *out and returns the index after.
absl::StatusOr<size_t> TranslateEscape(std::string_view p, size_t i, bool in_class,
                                       std::string* out) {
  if (i + 1 >= p.size()) return absl::InvalidArgumentError("pattern ends with a backslash");
  const char e = p[i + 1];
  if (std::string_view("hHvVwWbBRX").find(e) != std::string_view::npos ||
      (in_class && (e == 'S' || e == 'P'))) {
    return absl::InvalidArgumentError(
        absl::StrCat("escape \\", std::string(1, e), in_class ? " inside a character class" : "",
                     " means different things in Oniguruma and PCRE2; not supported"));
  }
  if (e == 's' || e == 'S') {
    absl::StrAppend(out, in_class ? "" : (e == 's' ? "[" : "[^"), kWhiteSpace, in_class ? "" : "]");
    return i + 2;
  }
  if ((e == 'p' || e == 'P') && i + 4 < p.size() && p[i + 2] == '{' && p[i + 4] == '}' &&
      ExtraFor(p[i + 3]) != nullptr) {
    const std::string prop(p.substr(i, 5));  // \p{L}
    if (in_class) {
      absl::StrAppend(out, prop, ExtraFor(p[i + 3]));
    } else {
      absl::StrAppend(out, e == 'p' ? "[" : "[^", "\\p{", std::string(1, p[i + 3]), "}",
                      ExtraFor(p[i + 3]), "]");
    }
    return i + 5;
  }
  if (e == 'u' && i + 6 <= p.size()) {
    absl::StrAppend(out, "\\x{", std::string(p.substr(i + 2, 4)), "}");
    return i + 6;
  }
  out->append(p.substr(i, 2));
  return i + 2;
}

}  // namespace

absl::StatusOr<std::string> TranslateOnigPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      auto next = TranslateEscape(p, i, in_class, &out);
      if (!next.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("at byte ", i, " of the pattern: ", next.status().message()));
      }
      i = *next;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      // A ']' or '^]' right after '[' is a literal, in both engines.
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);
      continue;
    }
    if (in_class && c == '[' && (i + 1 >= p.size() || p[i + 1] != ':')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "at byte ", i, " of the pattern: nested character classes are not supported"));
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("PCRE2 cannot compile the pattern at byte ", offset, ": ", Pcre2Error(error)));
  }
  const int jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  if (jit != 0) {
    pcre2_code_free(code);
    return absl::InternalError(absl::StrCat("PCRE2 JIT compilation failed: ", Pcre2Error(jit)));
  }
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::ForEachMatch(std::string_view text,
                                 absl::FunctionRef<void(size_t, size_t)> on_match) const {
  thread_local MatchState state;
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_jit_match(code, subject, text.size(), pos, 0, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return absl::InternalError(absl::StrCat("PCRE2 match failed: ", Pcre2Error(rc)));
    // Copied before on_match: it may match another regex on this thread (a ByteLevel stage with
    // use_regex inside a Split), which reuses `state` and overwrites the ovector; reading it
    // afterwards sent this loop back to the inner match's offset, forever (found by
    // tests/tokenizer/tokenizer_fuzz.cc).
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ov[0], end = ov[1];
    on_match(begin, end);
    if (end > begin) {
      pos = end;
    } else {  // empty match: step over one code point
      if (begin >= text.size()) break;
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  return absl::OkStatus();
}

}  // namespace dflash::tokenizer

#include "common/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/unicode.h"

namespace dflash::tokenizer {
namespace {

using Tokens = std::vector<std::string>;

// ByteLevel: each token's code points as bytes (a token with a code point outside the alphabet
// keeps its own UTF-8), all concatenated into one lossily decoded string.
Tokens ByteLevelChain(const Tokens& tokens) {
  std::string bytes;
  for (const std::string& t : tokens) {
    std::optional<std::string> b = byte_level::ToBytes(t);
    bytes += b ? *b : t;
  }
  return {unicode::Utf8Lossy(bytes)};
}

// The byte of a "<0xXX>" token, parsed as Rust's u8::from_str_radix(.., 16) does (a leading '+'
// is accepted), or -1.
int FallbackByte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// ByteFallback: runs of "<0xXX>" tokens become their bytes when those are valid UTF-8, else one
// U+FFFD per byte.
Tokens ByteFallbackChain(const Tokens& tokens) {
  Tokens out;
  std::string run;
  auto flush = [&] {
    if (run.empty()) return;
    if (unicode::FindInvalidUtf8(run) == unicode::kValid) {
      out.push_back(run);
    } else {
      for (size_t i = 0; i < run.size(); ++i) out.push_back("\xEF\xBF\xBD");
    }
    run.clear();
  };
  for (const std::string& t : tokens) {
    const int b = FallbackByte(t);
    if (b >= 0) {
      run.push_back(static_cast<char>(b));
    } else {
      flush();
      out.push_back(t);
    }
  }
  flush();
  return out;
}

// Strip: up to `start` leading and `stop` trailing code points equal to c are cut.
std::string StripToken(const std::string& t, char32_t c, size_t start, size_t stop) {
  std::vector<std::pair<char32_t, size_t>> chars;  // (code point, byte offset)
  for (size_t i = 0; i < t.size();) {
    int len;
    chars.emplace_back(unicode::DecodeAt(t, i, &len), i);
    i += static_cast<size_t>(len);
  }
  size_t begin = 0;
  while (begin < chars.size() && begin < start && chars[begin].first == c) ++begin;
  size_t end = chars.size();
  for (size_t i = 0; i < stop && end > begin && chars[end - 1].first == c; ++i) --end;
  const size_t from = begin < chars.size() ? chars[begin].second : t.size();
  const size_t to = end < chars.size() ? chars[end].second : t.size();
  return t.substr(from, to - from);
}

std::string ReplaceLiteral(const std::string& t, const std::string& pattern,
                           const std::string& content) {
  std::string out;
  size_t prev = 0;
  for (size_t at = t.find(pattern); at != std::string::npos; at = t.find(pattern, prev)) {
    out.append(t, prev, at - prev);
    out += content;
    prev = at + pattern.size();
  }
  out.append(t, prev);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(std::vector<DecoderStep> steps) {
  auto d = std::unique_ptr<Decoder>(new Decoder());
  for (const DecoderStep& step : steps) {
    std::unique_ptr<Regex> regex;
    if (step.type == DecoderStep::Type::kReplace && step.pattern_is_regex) {
      auto pcre = TranslateOnigPattern(step.pattern);
      if (!pcre.ok()) return Annotate(pcre.status(), step.field);
      auto compiled = Regex::Compile(*pcre);
      if (!compiled.ok()) return Annotate(compiled.status(), step.field);
      regex = *std::move(compiled);
    }
    d->regexes_.push_back(std::move(regex));
  }
  d->steps_ = std::move(steps);
  return d;
}

Decoder::~Decoder() = default;

bool Decoder::IsPlainByteLevel() const {
  return steps_.size() == 1 && steps_[0].type == DecoderStep::Type::kByteLevel;
}

absl::StatusOr<std::string> Decoder::Decode(Tokens tokens) const {
  for (size_t s = 0; s < steps_.size(); ++s) {
    const DecoderStep& step = steps_[s];
    switch (step.type) {
      case DecoderStep::Type::kByteLevel:
        tokens = ByteLevelChain(tokens);
        break;
      case DecoderStep::Type::kByteFallback:
        tokens = ByteFallbackChain(tokens);
        break;
      case DecoderStep::Type::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens = {std::move(all)};
        break;
      }
      case DecoderStep::Type::kReplace:
        for (std::string& t : tokens) {
          if (regexes_[s] == nullptr) {
            t = ReplaceLiteral(t, step.pattern, step.content);
            continue;
          }
          std::string out;
          size_t prev = 0;
          RETURN_IF_ERROR(regexes_[s]->ForEachMatch(t, [&](size_t start, size_t end) {
            out.append(t, prev, start - prev);
            out += step.content;
            prev = end;
          }));
          out.append(t, prev);
          t = std::move(out);
        }
        break;
      case DecoderStep::Type::kStrip:
        for (std::string& t : tokens) {
          t = StripToken(t, step.strip_char, step.strip_start, step.strip_stop);
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace dflash::tokenizer

#include "common/tokenizer/pretokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dflash::tokenizer {
namespace {

// ByteLevel's own split pattern (HF tokenizers pre_tokenizers/byte_level.rs), Oniguruma syntax.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::StatusOr<std::unique_ptr<Regex>> CompileOnig(std::string_view pattern) {
  ASSIGN_OR_RETURN(const std::string pcre, TranslateOnigPattern(pattern));
  return Regex::Compile(pcre);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    const PreTokenizerConfig& config) {
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  for (size_t i = 0; i < config.split_patterns.size(); ++i) {
    auto regex = CompileOnig(config.split_patterns[i]);
    if (!regex.ok()) {
      const std::string field =
          i < config.split_fields.size() ? config.split_fields[i] : absl::StrCat("split ", i);
      return Annotate(regex.status(), field);
    }
    pre->splits_.push_back(*std::move(regex));
  }
  if (config.use_regex) {
    ASSIGN_OR_RETURN(pre->gpt2_, CompileOnig(kGpt2Pattern));
  }
  pre->add_prefix_space_ = config.add_prefix_space;
  return pre;
}

absl::Status PreTokenizer::Run(std::string_view text, uint32_t base, Emit emit) const {
  if (text.empty()) return absl::OkStatus();
  return RunStage(0, text, base, emit);
}

absl::Status PreTokenizer::RunStage(size_t stage, std::string_view piece, uint32_t offset,
                                    Emit emit) const {
  if (stage == splits_.size()) return RunByteLevel(piece, offset, emit);
  // Isolated: every match is a piece, and so is every gap between matches.
  size_t prev = 0;
  absl::Status inner = absl::OkStatus();
  auto visit = [&](size_t start, size_t end) {
    if (!inner.ok()) return;
    if (start > prev) {
      inner = RunStage(stage + 1, piece.substr(prev, start - prev), offset + prev, emit);
    }
    if (inner.ok() && end > start) {
      inner = RunStage(stage + 1, piece.substr(start, end - start), offset + start, emit);
    }
    prev = end;
  };
  RETURN_IF_ERROR(splits_[stage]->ForEachMatch(piece, visit));
  RETURN_IF_ERROR(inner);
  if (prev < piece.size()) {
    return RunStage(stage + 1, piece.substr(prev), offset + static_cast<uint32_t>(prev), emit);
  }
  return absl::OkStatus();
}

absl::Status PreTokenizer::RunByteLevel(std::string_view piece, uint32_t offset, Emit emit) const {
  std::string prefixed;
  uint32_t phantom = 0;
  if (add_prefix_space_ && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
    phantom = 1;
  }
  if (gpt2_ == nullptr) {
    emit(piece, offset, phantom);
    return absl::OkStatus();
  }
  size_t prev = 0;
  auto emit_part = [&](size_t start, size_t end) {
    const uint32_t in_text = start > phantom ? static_cast<uint32_t>(start) - phantom : 0;
    emit(piece.substr(start, end - start), offset + in_text, start < phantom ? phantom : 0);
  };
  RETURN_IF_ERROR(gpt2_->ForEachMatch(piece, [&](size_t start, size_t end) {
    if (start > prev) emit_part(prev, start);
    if (end > start) emit_part(start, end);
    prev = end;
  }));
  if (prev < piece.size()) emit_part(prev, piece.size());
  return absl::OkStatus();
}

}  // namespace dflash::tokenizer

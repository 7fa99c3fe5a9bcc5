#include "common/data/eval_prompts.h"

#include <fstream>
#include <memory>
#include <set>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/data/builtin_data.h"
#include "common/data/builtin_tokenizer.h"
#include "common/data/chat_template.h"
#include "common/data/records.h"
#include "common/data/run_data.h"
#include "common/tokenizer/tokenizer.h"

namespace dflash::data {
namespace {

// Adds the document's prompt (tokens before the first supervised one); false when it has no
// prompt or no answer. *stop: the last token of the first supervised run.
bool AddPrompt(absl::Span<const int32_t> tokens, absl::Span<const uint8_t> mask, EvalPrompts* out,
               int64_t* stop) {
  size_t first = 0;
  while (first < mask.size() && mask[first] == 0) ++first;
  if (first == 0 || first == mask.size()) return false;
  size_t end = first;
  while (end < mask.size() && mask[end] != 0) ++end;
  *stop = tokens[end - 1];
  out->prompts.emplace_back(tokens.begin(), tokens.begin() + first);
  return true;
}

// A chat record's prompt: the messages before its first answer (all of them when it has none)
// rendered with add_generation_prompt=true. The answer, if any, is not used.
absl::StatusOr<std::vector<int32_t>> ChatPrompt(const tokenizer::Tokenizer& tok,
                                                const ResolvedChatTemplate& tmpl,
                                                const Record& record) {
  size_t end = 0;
  while (end < record.messages.size() && record.messages[end].role != Role::kAssistant) ++end;
  if (end == 0) return absl::InvalidArgumentError("no message before the first assistant answer");
  return TokenizePrompt(tok, tmpl, absl::MakeConstSpan(record.messages).subspan(0, end));
}

}  // namespace

absl::StatusOr<EvalPrompts> LoadEvalPrompts(const config::RunSpec& spec, const std::string& path,
                                            int64_t max_prompts, int64_t vocab_size) {
  if (max_prompts < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_prompts ", max_prompts, " must be >= 1"));
  }
  EvalPrompts out;
  int64_t stop = 0;
  if (absl::StartsWith(path, "builtin:")) {
    ASSIGN_OR_RETURN(std::unique_ptr<batching::DocumentSource> source,
                     BuiltinDataset(path.substr(8)));
    const int64_t n = source->num_documents();
    for (int64_t i = std::max<int64_t>(0, n - max_prompts); i < n; ++i) {
      ++out.records_read;
      batching::DocumentView d = source->document(i);
      if (!AddPrompt(d.tokens, d.loss_mask, &out, &stop)) ++out.records_skipped;
      if (out.origins.size() < out.prompts.size()) {
        out.origins.push_back(absl::StrCat(path, " document ", i));
      }
    }
    return out;
  }
  ASSIGN_OR_RETURN(DataFormat format, ParseDataFormat(spec.data.format));
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::set<int64_t> stops;
  TokenizeOptions topts;
  topts.format = format;
  topts.block_size = static_cast<int>(spec.drafter.block_size);
  if (format != DataFormat::kPretokenized) {
    config::RunSpec with_path = spec;
    with_path.data.train = path;
    ASSIGN_OR_RETURN(RunDataPaths paths, ResolveRunDataPaths(with_path));
    ASSIGN_OR_RETURN(tok, LoadTokenizer(paths.tokenizer));
    if (format == DataFormat::kChat) {
      ASSIGN_OR_RETURN(topts.chat_template,
                       ResolveChatTemplate(spec.data.chat_template, paths.tokenizer,
                                           paths.chat_template_dir, spec.data.thinking));
      ASSIGN_OR_RETURN(const int32_t end_of_turn, EndOfTurnToken(*tok, topts.chat_template));
      stops.insert(end_of_turn);
    }
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  std::string line, first_error;
  for (int64_t line_no = 1; std::getline(in, line) && out.prompts.size() < max_prompts; ++line_no) {
    if (line.empty()) continue;
    ++out.records_read;
    std::variant<Record, BadRecord> parsed =
        ParseRecord(line, format, /*require_assistant_turn=*/false);
    std::string error;
    if (auto* bad = std::get_if<BadRecord>(&parsed)) {
      error = bad->message;
    } else if (format == DataFormat::kChat) {
      absl::StatusOr<std::vector<int32_t>> prompt =
          ChatPrompt(*tok, topts.chat_template, std::get<Record>(parsed));
      if (prompt.ok()) {
        out.prompts.emplace_back(prompt->begin(), prompt->end());
      } else {
        error = std::string(prompt.status().message());
      }
    } else if (format == DataFormat::kPretokenized) {
      const Record& r = std::get<Record>(parsed);
      bool in_range = true;
      for (int32_t id : r.input_ids) in_range &= id >= 0 && id < vocab_size;
      if (!in_range) {
        error = absl::StrCat("input_ids: a token is outside the vocabulary [0, ", vocab_size, ")");
      } else if (!AddPrompt(r.input_ids, r.loss_mask, &out, &stop)) {
        error = "no prompt before the first supervised token, or no supervised token";
      }
    } else {
      std::variant<Document, BadRecord> doc = TokenizeRecord(std::get<Record>(parsed), *tok, topts);
      if (auto* bad = std::get_if<BadRecord>(&doc)) {
        error = bad->message;
      } else if (!AddPrompt(std::get<Document>(doc).tokens, std::get<Document>(doc).loss_mask, &out,
                            &stop)) {
        error = "no prompt before the first supervised token, or no supervised token";
      }
    }
    if (!error.empty()) {
      ++out.records_skipped;
      if (first_error.empty()) first_error = absl::StrCat(path, ":", line_no, ": ", error);
    }
    if (out.origins.size() < out.prompts.size())
      out.origins.push_back(absl::StrCat(path, ":", line_no));
  }
  if (out.prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": no usable prompt in ", out.records_read, " records",
        first_error.empty() ? "" : absl::StrCat(" (first problem: ", first_error, ")")));
  }
  out.stop_token_ids.assign(stops.begin(), stops.end());
  return out;
}

}  // namespace dflash::data

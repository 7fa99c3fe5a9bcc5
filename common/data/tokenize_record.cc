// The tokenizer-dependent half of chat_template.h: template token checks, pieces -> ids and loss
// mask, and record -> document.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/data/chat_template.h"

namespace dflash::data {

absl::Status CheckTemplateTokens(const ResolvedChatTemplate& resolved,
                                 const tokenizer::Tokenizer& tok) {
  if (resolved.kind == ChatTemplate::kJinja) {
    absl::StatusOr<int32_t> end = EndOfTurnToken(tok, resolved);
    if (!end.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data.chat_template: the template cannot render a conversation with this tokenizer: ",
          end.status().message()));
    }
    return absl::OkStatus();
  }
  const ChatTemplate tmpl = resolved.kind;
  std::vector<absl::string_view> needed;
  if (tmpl == ChatTemplate::kChatml) {
    needed = {kImStart, kImEnd};
  } else {
    needed = {kBeginOfText, kStartHeader, kEndHeader, kEotId};
  }
  for (absl::string_view token : needed) {
    // Encoding it (rather than looking it up) also catches a token that is in the vocabulary but
    // not an added token, which BPE would split like ordinary text.
    absl::StatusOr<std::vector<int32_t>> ids = tok.EncodeIds(std::string(token));
    if (!ids.ok() || ids->size() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chat template ", ChatTemplateName(tmpl), " writes ", token,
          " but the tokenizer does not encode it as one token; choose the template that matches "
          "the tokenizer (data.chat_template)"));
    }
  }
  return absl::OkStatus();
}

int64_t Document::num_supervised() const {
  int64_t n = 0;
  for (uint8_t m : loss_mask) n += m;
  return n;
}

absl::StatusOr<Document> TokenizePieces(const tokenizer::Tokenizer& tok,
                                        absl::Span<const TemplatePiece> pieces) {
  std::string text;
  // piece_end[i]: one past the last byte of piece i in the normalized concatenation.
  std::vector<size_t> piece_end;
  piece_end.reserve(pieces.size());
  for (const TemplatePiece& piece : pieces) {
    ASSIGN_OR_RETURN(std::string normalized, tok.Normalize(piece.text));
    text += normalized;
    piece_end.push_back(text.size());
  }
  // The pieces are normalized one by one above; their concatenation is normalized as well because
  // every template boundary follows a newline or a special token, which no mark composes with.
  tokenizer::Tokenizer::EncodeOptions encode_options;
  encode_options.text_is_normalized = true;
  ASSIGN_OR_RETURN(tokenizer::Encoding enc, tok.Encode(text, encode_options));
  if (enc.offsets.size() != enc.ids.size()) {
    return DFLASH_INTERNAL_ERROR("tokenizer returned offsets and ids of different lengths");
  }
  Document doc;
  doc.tokens = std::move(enc.ids);
  doc.loss_mask.resize(doc.tokens.size());
  // Offsets are non-decreasing, so one forward walk over the pieces suffices.
  size_t piece = 0;
  for (size_t t = 0; t < doc.tokens.size(); ++t) {
    while (piece < pieces.size() && enc.offsets[t] >= piece_end[piece]) ++piece;
    doc.loss_mask[t] = piece < pieces.size() && pieces[piece].supervised ? 1 : 0;
  }
  return doc;
}

absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const tokenizer::Tokenizer& tok,
                                                    const ResolvedChatTemplate& tmpl,
                                                    absl::Span<const Message> messages) {
  ASSIGN_OR_RETURN(std::string text, RenderPromptText(tmpl, messages));
  ASSIGN_OR_RETURN(Document doc, TokenizePieces(tok, {TemplatePiece{std::move(text), false}}));
  return std::move(doc.tokens);
}

absl::StatusOr<int32_t> EndOfTurnToken(const tokenizer::Tokenizer& tok,
                                       const ResolvedChatTemplate& tmpl) {
  const std::vector<Message> probe = {{Role::kUser, "Hi"}, {Role::kAssistant, "Hello"}};
  ASSIGN_OR_RETURN(std::vector<TemplatePiece> pieces, RenderChatPieces(tmpl, probe));
  ASSIGN_OR_RETURN(Document doc, TokenizePieces(tok, pieces));
  for (size_t t = doc.tokens.size(); t > 0; --t) {
    if (doc.loss_mask[t - 1] != 0) return doc.tokens[t - 1];
  }
  return absl::FailedPreconditionError(
      "the template marks no answer in a probe conversation (user 'Hi', assistant 'Hello')");
}

namespace {

// Lines are UTF-8-checked and JSON strings decode to valid UTF-8 before the tokenizer sees them,
// so an Encode error here is the tokenizer's own refusal.
BadRecord FromTokenizerError(const absl::Status& status) {
  return {DropReason::kTokenizerError, absl::StrCat("(tokenizer): ", status.message())};
}

std::variant<Document, BadRecord> CheckSupervised(Document doc, int block_size) {
  const int64_t supervised = doc.num_supervised();
  if (supervised < 2 * static_cast<int64_t>(block_size)) {
    return BadRecord{DropReason::kTooFewSupervised,
                     absl::StrCat("(document): ", supervised, " supervised tokens, fewer than 2 * ",
                                  "block_size = ", 2 * static_cast<int64_t>(block_size))};
  }
  return doc;
}

}  // namespace

std::variant<Document, BadRecord> TokenizeRecord(const Record& record,
                                                 const tokenizer::Tokenizer& tok,
                                                 const TokenizeOptions& options) {
  Document doc;
  switch (options.format) {
    case DataFormat::kChat: {
      absl::StatusOr<std::vector<TemplatePiece>> pieces =
          RenderChatPieces(options.chat_template, record.messages);
      if (!pieces.ok()) {
        return BadRecord{DropReason::kTemplateError,
                         absl::StrCat("(chat template): ", pieces.status().message())};
      }
      absl::StatusOr<Document> d = TokenizePieces(tok, *pieces);
      if (!d.ok()) return FromTokenizerError(d.status());
      doc = *std::move(d);
      break;
    }
    case DataFormat::kText: {
      absl::StatusOr<std::vector<int32_t>> ids = tok.EncodeIds(record.text);
      if (!ids.ok()) return FromTokenizerError(ids.status());
      doc.tokens = *std::move(ids);
      doc.loss_mask.assign(doc.tokens.size(), 1);
      break;
    }
    case DataFormat::kPretokenized: {
      const int64_t vocab = tok.vocab_size();
      for (size_t i = 0; i < record.input_ids.size(); ++i) {
        if (record.input_ids[i] < 0 || record.input_ids[i] >= vocab) {
          return BadRecord{DropReason::kTokenOutOfRange,
                           absl::StrCat("input_ids[", i, "]: ", record.input_ids[i],
                                        " is outside the vocabulary [0, ", vocab, ")")};
        }
      }
      doc.tokens = record.input_ids;
      doc.loss_mask = record.loss_mask;
      break;
    }
  }
  return CheckSupervised(std::move(doc), options.block_size);
}

}  // namespace dflash::data

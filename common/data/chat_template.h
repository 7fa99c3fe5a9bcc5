// Chat templates and loss masks: how a parsed record becomes a training document (token ids and a
// loss mask that is 1 on supervised tokens).
//
// Built-in templates (the strings are exactly what the official Jinja templates render with
// add_generation_prompt=False):
//   chatml  per message: "<|im_start|>{role}\n{content}<|im_end|>\n"          (Qwen2/2.5/3)
//   llama3  "<|begin_of_text|>", then per message:
//           "<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>"
//           (Llama-3's template trims each content as Python's str.strip() does.)
// Neither injects a default system prompt or reasoning ("<think>") blocks; a model whose own
// template does (Qwen2.5's default system prompt, Qwen3's thinking blocks) must be given data that
// already contains them.
//
// Loss mask. Supervised = the content of assistant turns AND the turn's end token (<|im_end|> /
// <|eot_id|>), so the drafter learns to end a turn. Role headers, the newline after <|im_end|>,
// and system/user/tool turns are 0.
//
// Tokenization (TokenizePieces): the template renders a list of pieces (text, supervised?); each
// piece is normalized with the tokenizer's normalizer, the pieces are concatenated and encoded
// ONCE, so BPE sees exactly the string that inference sees. A token is supervised iff its first
// byte lies in a supervised piece. (A token that straddles a boundary, e.g. a header's "\n" merged
// with newlines that open the content, therefore belongs to the piece where it starts.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/data/records.h"
#include "common/tokenizer/tokenizer.h"

namespace dflash::data {

enum class ChatTemplate { kChatml = 0, kLlama3 = 1 };

// The special tokens the built-in templates write.
inline constexpr absl::string_view kImStart = "<|im_start|>";
inline constexpr absl::string_view kImEnd = "<|im_end|>";
inline constexpr absl::string_view kBeginOfText = "<|begin_of_text|>";
inline constexpr absl::string_view kStartHeader = "<|start_header_id|>";
inline constexpr absl::string_view kEndHeader = "<|end_header_id|>";
inline constexpr absl::string_view kEotId = "<|eot_id|>";

// "chatml", "llama3".
absl::string_view ChatTemplateName(ChatTemplate tmpl);
// Accepts "chatml" and "llama3" only ("auto" is resolved by ResolveChatTemplate).
absl::StatusOr<ChatTemplate> ParseChatTemplate(absl::string_view name);

// Picks the built-in template a Jinja chat template corresponds to, by its markers:
// <|im_start|> and <|im_end|> -> chatml; <|start_header_id|> and <|eot_id|> -> llama3. Anything
// else (or both) is an InvalidArgument error.
absl::StatusOr<ChatTemplate> DetectChatTemplate(absl::string_view jinja);

// Resolves data.chat_template. "chatml"/"llama3" are returned as is. "auto" reads the chat template
// that ships beside `tokenizer_json`: chat_template.jinja if present, else the "chat_template" of
// tokenizer_config.json (a string, or a list of {name, template} whose "default" entry is used),
// and detects it. When none is found or it is not recognised the error names the files looked at
// and tells the user to set data.chat_template.
absl::StatusOr<ChatTemplate> ResolveChatTemplate(absl::string_view setting,
                                                 const std::filesystem::path& tokenizer_json);

// The special tokens a template writes; each must be ONE token of the tokenizer, or its markers
// would be split into ordinary text pieces. Returns FailedPrecondition naming the missing token.
absl::Status CheckTemplateTokens(ChatTemplate tmpl, const tokenizer::Tokenizer& tok);

struct TemplatePiece {
  std::string text;
  bool supervised = false;
};

// Renders a conversation into pieces; their concatenation is the full rendered string.
std::vector<TemplatePiece> RenderChat(ChatTemplate tmpl, absl::Span<const Message> messages);
// The concatenated rendered string (tests, debugging).
std::string RenderChatText(ChatTemplate tmpl, absl::Span<const Message> messages);

// A tokenized training document.
struct Document {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;  // same length; 1 = supervised
  int64_t num_supervised() const;
};

// Normalizes each piece, concatenates, encodes once and derives the mask (see the file comment).
// Errors are the tokenizer's (e.g. invalid UTF-8).
absl::StatusOr<Document> TokenizePieces(const tokenizer::Tokenizer& tok,
                                        absl::Span<const TemplatePiece> pieces);

// What TokenizeRecord needs besides the record.
struct TokenizeOptions {
  DataFormat format = DataFormat::kChat;
  ChatTemplate chat_template = ChatTemplate::kChatml;  // used for chat records only
  int block_size = 16;  // documents with < 2 * block_size supervised tokens are dropped
};

// Record -> document: chat records are rendered and tokenized, text records are encoded with every
// token supervised, pretokenized records are range-checked against tok.vocab_size(). Refusals:
// token_out_of_range, too_few_supervised, tokenizer_error.
std::variant<Document, BadRecord> TokenizeRecord(const Record& record,
                                                 const tokenizer::Tokenizer& tok,
                                                 const TokenizeOptions& options);

}  // namespace dflash::data

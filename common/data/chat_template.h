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
// template does (Qwen2.5's and SmolLM2's default system prompts, Qwen3's thinking blocks) renders
// differently from them. data.chat_template: auto therefore renders the target checkpoint's own
// Jinja template (jinja_chat.h, the common/jinja interpreter): the chat_template.jinja of the
// checkpoint directory, else the "chat_template" of its tokenizer_config.json; the built-in names
// stay explicit choices.
//
// Loss mask. Supervised = the content of assistant turns AND the turn's end token (<|im_end|> /
// <|eot_id|>), so the drafter learns to end a turn. Role headers, the newline after <|im_end|>,
// and system/user/tool turns are 0. For a Jinja template the supervised text of each answer is
// what the template adds after the generation prompt (jinja_chat.h).
//
// Tokenization (TokenizePieces): the template renders a list of pieces (text, supervised?); each
// piece is normalized with the tokenizer's normalizer, the pieces are concatenated and encoded
// ONCE, so BPE sees exactly the string that inference sees. A token is supervised iff its first
// byte lies in a supervised piece. (A token that straddles a boundary, e.g. a header's "\n" merged
// with newlines that open the content, therefore belongs to the piece where it starts.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/data/records.h"
#include "common/tokenizer/tokenizer.h"

namespace dflash::data {

// kJinja: the checkpoint's own template (only through "auto").
enum class ChatTemplate { kChatml = 0, kLlama3 = 1, kJinja = 2 };

class JinjaChatTemplate;  // jinja_chat.h

// A resolved data.chat_template: a built-in, or the checkpoint's Jinja template.
struct ResolvedChatTemplate {
  ResolvedChatTemplate(ChatTemplate builtin = ChatTemplate::kChatml)  // NOLINT: implicit
      : kind(builtin) {}
  explicit ResolvedChatTemplate(std::shared_ptr<const JinjaChatTemplate> t)
      : kind(ChatTemplate::kJinja), jinja(std::move(t)) {}
  ChatTemplate kind;
  std::shared_ptr<const JinjaChatTemplate> jinja;  // kind == kJinja
};
inline bool operator==(const ResolvedChatTemplate& a, ChatTemplate b) { return a.kind == b; }

// The special tokens the built-in templates write.
inline constexpr absl::string_view kImStart = "<|im_start|>";
inline constexpr absl::string_view kImEnd = "<|im_end|>";
inline constexpr absl::string_view kBeginOfText = "<|begin_of_text|>";
inline constexpr absl::string_view kStartHeader = "<|start_header_id|>";
inline constexpr absl::string_view kEndHeader = "<|end_header_id|>";
inline constexpr absl::string_view kEotId = "<|eot_id|>";

// "chatml", "llama3", "jinja".
absl::string_view ChatTemplateName(ChatTemplate tmpl);
// Accepts "chatml" and "llama3" only ("auto" is resolved by ResolveChatTemplate).
absl::StatusOr<ChatTemplate> ParseChatTemplate(absl::string_view name);

// Picks the built-in template a Jinja chat template corresponds to, by its markers:
// <|im_start|> and <|im_end|> -> chatml; <|start_header_id|> and <|eot_id|> -> llama3. Anything
// else (or both) is an InvalidArgument error.
absl::StatusOr<ChatTemplate> DetectChatTemplate(absl::string_view jinja);

// Resolves data.chat_template. "chatml"/"llama3" are returned as is. "auto" reads the chat template
// of the checkpoint directory `template_dir` (empty: the directory of `tokenizer_json`):
// chat_template.jinja if present, else the "chat_template" of tokenizer_config.json (a string, or
// a list of {name, template} whose "default" entry is used), with the special tokens of that
// tokenizer_config.json, and parses it as Jinja. When none is found the error names the files
// looked at and tells the user to set data.chat_template; a template the interpreter cannot parse
// is an error naming the file, line and column.
//
// `thinking` (data.thinking: auto | on | off): on / off set the template's enable_thinking (as
// apply_chat_template(enable_thinking=...) does); a template without that switch, or a built-in
// one, is refused naming data.thinking.
absl::StatusOr<ResolvedChatTemplate> ResolveChatTemplate(
    absl::string_view setting, const std::filesystem::path& tokenizer_json,
    const std::filesystem::path& template_dir = {}, absl::string_view thinking = "auto");

// The name a prepared file records for a template rendered with `thinking`: the template's name,
// "+think" for on and "-think" for off ("jinja-think").
std::string RecordedTemplateName(ChatTemplate kind, absl::string_view thinking);
// The thinking mode a recorded name says ("auto" without a suffix).
std::string RecordedThinking(absl::string_view recorded_name);

// The special tokens a template writes; each must be ONE token of the tokenizer, or its markers
// would be split into ordinary text pieces. Returns FailedPrecondition naming the missing token.
// A Jinja template must render a probe conversation and close its answer with one token.
absl::Status CheckTemplateTokens(const ResolvedChatTemplate& tmpl, const tokenizer::Tokenizer& tok);

struct TemplatePiece {
  std::string text;
  bool supervised = false;
};

// Renders a conversation into pieces with a built-in template; their concatenation is the full
// rendered string.
std::vector<TemplatePiece> RenderChat(ChatTemplate tmpl, absl::Span<const Message> messages);
// The concatenated rendered string (tests, debugging).
std::string RenderChatText(ChatTemplate tmpl, absl::Span<const Message> messages);
// Any resolved template; a Jinja template can fail (render error, not prefix-consistent).
absl::StatusOr<std::vector<TemplatePiece>> RenderChatPieces(const ResolvedChatTemplate& tmpl,
                                                            absl::Span<const Message> messages);
// The prompt that asks for the next answer: the conversation rendered with
// add_generation_prompt=true (built-ins: their assistant header after the messages).
absl::StatusOr<std::string> RenderPromptText(const ResolvedChatTemplate& tmpl,
                                             absl::Span<const Message> messages);

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

// The token ids of RenderPromptText (normalized and encoded as TokenizePieces does).
absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const tokenizer::Tokenizer& tok,
                                                    const ResolvedChatTemplate& tmpl,
                                                    absl::Span<const Message> messages);

// The token that ends an answer: the last supervised token of a rendered probe conversation
// (<|im_end|>, <|eot_id|>, ...); generation stops there.
absl::StatusOr<int32_t> EndOfTurnToken(const tokenizer::Tokenizer& tok,
                                       const ResolvedChatTemplate& tmpl);

// What TokenizeRecord needs besides the record.
struct TokenizeOptions {
  DataFormat format = DataFormat::kChat;
  ResolvedChatTemplate chat_template = ChatTemplate::kChatml;  // used for chat records only
  int block_size = 16;  // documents with < 2 * block_size supervised tokens are dropped
};

// Record -> document: chat records are rendered and tokenized, text records are encoded with every
// token supervised, pretokenized records are range-checked against tok.vocab_size(). Refusals:
// token_out_of_range, too_few_supervised, tokenizer_error, template_error.
std::variant<Document, BadRecord> TokenizeRecord(const Record& record,
                                                 const tokenizer::Tokenizer& tok,
                                                 const TokenizeOptions& options);

}  // namespace dflash::data

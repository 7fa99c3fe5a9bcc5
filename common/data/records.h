// One line of a training JSONL file, parsed into a record (before tokenization), or the reason it
// is refused. Three formats, chosen by `data.format`:
//
//   chat          {"messages": [{"role": "user", "content": "..."}, ...]}           (OpenAI)
//                 {"conversations": [{"from": "human", "value": "..."}, ...]}       (ShareGPT)
//                 OpenAI `content` is a string or a list of parts; only {"type": "text", "text"}
//                 parts are accepted (their texts are concatenated), any other part type is
//                 refused (unsupported_content) rather than silently dropped.
//   pretokenized  {"input_ids": [int, ...], "loss_mask": [0|1, ...]}  (same length)
//   text          {"text": "..."}  (every token supervised)
//
// Other keys of a record (ids, metadata, "name", "tool_calls", ...) are ignored. If a record has
// both "messages" and "conversations", "messages" is used.
//
// Roles. OpenAI `role` must be one of system, user, assistant, tool; `developer` (OpenAI's newer
// name for system) is read as system. ShareGPT `from` is mapped as follows (case-sensitive):
//   system                                     -> system
//   human, user                                -> user
//   gpt, assistant, chatgpt, model, bard, bing,
//   function_call                              -> assistant
//   tool, function, observation, ipython       -> tool
// Anything else is unknown_role. The role written into the chat template is the mapped one.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dflash::data {

enum class DataFormat { kChat = 0, kPretokenized = 1, kText = 2 };

// "chat", "pretokenized", "text" (the values of data.format).
absl::string_view DataFormatName(DataFormat format);
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);

enum class Role { kSystem = 0, kUser = 1, kAssistant = 2, kTool = 3 };

// "system", "user", "assistant", "tool": what the chat template writes as the role.
absl::string_view RoleName(Role role);

struct Message {
  Role role = Role::kUser;
  std::string content;
};

// A parsed record. Which members are filled depends on the format.
struct Record {
  std::vector<Message> messages;   // chat
  std::string text;                // text
  std::vector<int32_t> input_ids;  // pretokenized
  std::vector<uint8_t> loss_mask;  // pretokenized, same length as input_ids, values 0/1
};

// Why a record was dropped. The names (DropReasonName) are stable: they appear in reports, JSON
// output and metrics, so new reasons are appended and existing ones are never renamed.
enum class DropReason {
  kMalformedJson = 0,   // the line is not one JSON value
  kWrongType,           // a field has the wrong JSON type (or the line is not an object)
  kMissingField,        // a required field is absent
  kUnknownRole,         // a role / from value outside the accepted set
  kUnsupportedContent,  // an OpenAI content part whose type is not "text"
  kEmptyConversation,   // messages / conversations is an empty list
  kNoAssistantTurn,     // a conversation without an assistant turn
  kInvalidUtf8,         // the line is not valid UTF-8
  kLengthMismatch,      // pretokenized: input_ids and loss_mask differ in length
  kInvalidLossMask,     // pretokenized: a loss_mask value other than 0 or 1
  kTokenOutOfRange,     // pretokenized: an id outside [0, vocab_size)
  kTooFewSupervised,    // fewer than 2 * block_size supervised tokens
  kLineTooLong,         // the line exceeds the reader's line limit
  kTokenizerError,      // the tokenizer refused the text for another reason
  kTemplateError,       // the chat template failed to render the conversation, or is not
                        // prefix-consistent at one of its answers
};
inline constexpr int kNumDropReasons = static_cast<int>(DropReason::kTemplateError) + 1;

// Stable snake_case name: "malformed_json", "wrong_type", "missing_field", "unknown_role",
// "unsupported_content", "empty_conversation", "no_assistant_turn", "invalid_utf8",
// "length_mismatch", "invalid_loss_mask", "token_out_of_range", "too_few_supervised",
// "line_too_long", "tokenizer_error", "template_error".
absl::string_view DropReasonName(DropReason reason);
std::optional<DropReason> ParseDropReason(absl::string_view name);

// A refused record: the reason and a message naming the field, e.g.
// "messages[2].role: unknown role 'narrator' (accepted: system, user, assistant, tool, developer)".
struct BadRecord {
  DropReason reason = DropReason::kMalformedJson;
  std::string message;
};

// Parses one line (without its trailing newline; a trailing '\r' is tolerated). Checks structure,
// types, roles, UTF-8, and for pretokenized records lengths and mask values. It does not know the
// vocabulary: id range checks happen at tokenization (TokenizeRecord in chat_template.h).
// `require_assistant_turn` false accepts chat records without an assistant turn (prompts to
// generate from: eval prompts).
std::variant<Record, BadRecord> ParseRecord(absl::string_view line, DataFormat format,
                                            bool require_assistant_turn = true);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF);
// otherwise *bad_offset (when given) receives the offset of the first bad byte.
bool IsValidUtf8(absl::string_view text, size_t* bad_offset = nullptr);

}  // namespace dflash::data

#include "common/data/records.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace dflash::data {
namespace {

using json = nlohmann::json;

constexpr std::array<absl::string_view, kNumDropReasons> kDropReasonNames = {
    "malformed_json",      "wrong_type",         "missing_field",      "unknown_role",
    "unsupported_content", "empty_conversation", "no_assistant_turn",  "invalid_utf8",
    "length_mismatch",     "invalid_loss_mask",  "token_out_of_range", "too_few_supervised",
    "line_too_long",       "tokenizer_error",    "template_error"};

BadRecord Bad(DropReason reason, std::string message) { return {reason, std::move(message)}; }

// nlohmann's type_name() says "number" for integers and floats alike; the user wants to know which.
std::string TypeName(const json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "float";
  return value.type_name();
}

BadRecord WrongType(absl::string_view field, absl::string_view want, const json& got) {
  return Bad(DropReason::kWrongType,
             absl::StrCat(field, ": expected ", want, ", got ", TypeName(got)));
}

struct RoleName2 {
  absl::string_view name;
  Role role;
};

// The accepted roles, documented in records.h.
constexpr RoleName2 kOpenAiRoles[] = {{"system", Role::kSystem},
                                      {"user", Role::kUser},
                                      {"assistant", Role::kAssistant},
                                      {"tool", Role::kTool},
                                      {"developer", Role::kSystem}};
constexpr RoleName2 kShareGptRoles[] = {
    {"system", Role::kSystem},       {"human", Role::kUser},
    {"user", Role::kUser},           {"gpt", Role::kAssistant},
    {"assistant", Role::kAssistant}, {"chatgpt", Role::kAssistant},
    {"model", Role::kAssistant},     {"bard", Role::kAssistant},
    {"bing", Role::kAssistant},      {"function_call", Role::kAssistant},
    {"tool", Role::kTool},           {"function", Role::kTool},
    {"observation", Role::kTool},    {"ipython", Role::kTool}};

template <size_t N>
std::optional<Role> LookupRole(const RoleName2 (&table)[N], absl::string_view name) {
  for (const RoleName2& entry : table) {
    if (entry.name == name) return entry.role;
  }
  return std::nullopt;
}

template <size_t N>
std::string AcceptedRoles(const RoleName2 (&table)[N]) {
  std::vector<absl::string_view> names;
  for (const RoleName2& entry : table) names.push_back(entry.name);
  return absl::StrJoin(names, ", ");
}

// OpenAI content: a string, or a list of {"type": "text", "text": ...} parts.
std::optional<BadRecord> ReadContent(const json& content, const std::string& field,
                                     std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return WrongType(field, "a string or a list of text parts", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string part_field = absl::StrCat(field, "[", i, "]");
    if (!part.is_object()) return WrongType(part_field, "an object", part);
    auto type = part.find("type");
    if (type == part.end()) return Bad(DropReason::kMissingField, part_field + ".type: missing");
    if (!type->is_string()) return WrongType(part_field + ".type", "a string", *type);
    if (type->get_ref<const std::string&>() != "text") {
      return Bad(DropReason::kUnsupportedContent,
                 absl::StrCat(part_field, ".type: unsupported content part '",
                              type->get_ref<const std::string&>(), "' (only 'text' is accepted)"));
    }
    auto text = part.find("text");
    if (text == part.end()) return Bad(DropReason::kMissingField, part_field + ".text: missing");
    if (!text->is_string()) return WrongType(part_field + ".text", "a string", *text);
    out->append(text->get_ref<const std::string&>());
  }
  return std::nullopt;
}

struct ChatKeys {
  const char* list;     // "messages" / "conversations"
  const char* role;     // "role" / "from"
  const char* content;  // "content" / "value"
  bool openai;
};

std::optional<BadRecord> ReadMessage(const json& item, const std::string& field,
                                     const ChatKeys& keys, Message* out) {
  if (!item.is_object()) return WrongType(field, "an object", item);
  auto role = item.find(keys.role);
  if (role == item.end()) {
    return Bad(DropReason::kMissingField, absl::StrCat(field, ".", keys.role, ": missing"));
  }
  if (!role->is_string()) return WrongType(absl::StrCat(field, ".", keys.role), "a string", *role);
  const std::string& role_name = role->get_ref<const std::string&>();
  std::optional<Role> mapped =
      keys.openai ? LookupRole(kOpenAiRoles, role_name) : LookupRole(kShareGptRoles, role_name);
  if (!mapped) {
    return Bad(DropReason::kUnknownRole,
               absl::StrCat(
                   field, ".", keys.role, ": unknown role '", role_name, "' (accepted: ",
                   keys.openai ? AcceptedRoles(kOpenAiRoles) : AcceptedRoles(kShareGptRoles), ")"));
  }
  out->role = *mapped;
  auto content = item.find(keys.content);
  const std::string content_field = absl::StrCat(field, ".", keys.content);
  if (content == item.end()) return Bad(DropReason::kMissingField, content_field + ": missing");
  if (keys.openai) return ReadContent(*content, content_field, &out->content);
  if (!content->is_string()) return WrongType(content_field, "a string", *content);
  out->content = content->get<std::string>();
  return std::nullopt;
}

std::optional<BadRecord> ParseChat(const json& doc, bool require_assistant, Record* out) {
  ChatKeys keys{"messages", "role", "content", true};
  auto list = doc.find("messages");
  if (list == doc.end()) {
    keys = ChatKeys{"conversations", "from", "value", false};
    list = doc.find("conversations");
  }
  if (list == doc.end()) {
    return Bad(DropReason::kMissingField,
               "messages: missing (a chat record needs 'messages' or 'conversations')");
  }
  if (!list->is_array()) return WrongType(keys.list, "a list", *list);
  if (list->empty()) {
    return Bad(DropReason::kEmptyConversation, absl::StrCat(keys.list, ": empty conversation"));
  }
  out->messages.resize(list->size());
  bool has_assistant = false;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string field = absl::StrCat(keys.list, "[", i, "]");
    if (auto bad = ReadMessage((*list)[i], field, keys, &out->messages[i])) return bad;
    has_assistant |= out->messages[i].role == Role::kAssistant;
  }
  if (!has_assistant && require_assistant) {
    return Bad(DropReason::kNoAssistantTurn,
               absl::StrCat(keys.list, ": no assistant turn (nothing to supervise)"));
  }
  return std::nullopt;
}

std::optional<BadRecord> ParseIntList(const json& doc, const char* name, int64_t lo, int64_t hi,
                                      DropReason range_reason, std::vector<int64_t>* out) {
  auto list = doc.find(name);
  if (list == doc.end()) return Bad(DropReason::kMissingField, absl::StrCat(name, ": missing"));
  if (!list->is_array()) return WrongType(name, "a list of integers", *list);
  out->reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& v = (*list)[i];
    const std::string field = absl::StrCat(name, "[", i, "]");
    if (!v.is_number_integer()) return WrongType(field, "an integer", v);
    // Unsigned values above INT64_MAX would wrap in get<int64_t>().
    const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{1} << 62;
    const int64_t x = too_big ? hi + 1 : v.get<int64_t>();
    if (x < lo || x > hi) {
      return Bad(range_reason,
                 absl::StrCat(field, ": ", v.dump(), " is outside [", lo, ", ", hi, "]"));
    }
    out->push_back(x);
  }
  return std::nullopt;
}

std::optional<BadRecord> ParsePretokenized(const json& doc, Record* out) {
  std::vector<int64_t> ids, mask;
  // The vocabulary is checked at tokenization; here ids only need to fit int32.
  if (auto bad = ParseIntList(doc, "input_ids", 0, INT32_MAX, DropReason::kTokenOutOfRange, &ids)) {
    return bad;
  }
  if (auto bad = ParseIntList(doc, "loss_mask", 0, 1, DropReason::kInvalidLossMask, &mask)) {
    return bad;
  }
  if (ids.size() != mask.size()) {
    return Bad(
        DropReason::kLengthMismatch,
        absl::StrCat("loss_mask: has ", mask.size(), " entries but input_ids has ", ids.size()));
  }
  out->input_ids.assign(ids.begin(), ids.end());
  out->loss_mask.assign(mask.begin(), mask.end());
  return std::nullopt;
}

std::optional<BadRecord> ParseText(const json& doc, Record* out) {
  auto text = doc.find("text");
  if (text == doc.end()) return Bad(DropReason::kMissingField, "text: missing");
  if (!text->is_string()) return WrongType("text", "a string", *text);
  out->text = text->get<std::string>();
  return std::nullopt;
}

// Length of the UTF-8 sequence led by `b`, or 0 for a byte that cannot lead one.
int SequenceLength(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

}  // namespace

absl::string_view DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kChat:
      return "chat";
    case DataFormat::kPretokenized:
      return "pretokenized";
    case DataFormat::kText:
      return "text";
  }
  return "unknown";
}

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  for (DataFormat f : {DataFormat::kChat, DataFormat::kPretokenized, DataFormat::kText}) {
    if (DataFormatName(f) == name) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data format '", name, "' (expected chat, pretokenized or text)"));
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kSystem:
      return "system";
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
    case Role::kTool:
      return "tool";
  }
  return "unknown";
}

absl::string_view DropReasonName(DropReason reason) {
  const int i = static_cast<int>(reason);
  return i >= 0 && i < kNumDropReasons ? kDropReasonNames[i] : "unknown";
}

std::optional<DropReason> ParseDropReason(absl::string_view name) {
  for (int i = 0; i < kNumDropReasons; ++i) {
    if (kDropReasonNames[i] == name) return static_cast<DropReason>(i);
  }
  return std::nullopt;
}

bool IsValidUtf8(absl::string_view text, size_t* bad_offset) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {  // ASCII fast path: most of a chat corpus
      ++i;
      continue;
    }
    const int len = SequenceLength(s[i]);
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) ok = (s[i + k] & 0xC0) == 0x80;
    if (ok && len == 3) {
      // No overlongs (E0 80..9F) and no surrogates (ED A0..BF).
      ok = !(s[i] == 0xE0 && s[i + 1] < 0xA0) && !(s[i] == 0xED && s[i + 1] >= 0xA0);
    }
    if (ok && len == 4) {
      // No overlongs (F0 80..8F) and nothing above U+10FFFF (F4 90..).
      ok = !(s[i] == 0xF0 && s[i + 1] < 0x90) && !(s[i] == 0xF4 && s[i + 1] >= 0x90);
    }
    if (!ok) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

std::variant<Record, BadRecord> ParseRecord(absl::string_view line, DataFormat format,
                                            bool require_assistant_turn) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  size_t bad_offset = 0;
  if (!IsValidUtf8(line, &bad_offset)) {
    return Bad(DropReason::kInvalidUtf8,
               absl::StrCat("(line): invalid UTF-8 at byte ", bad_offset));
  }
  json doc;
  try {
    doc = json::parse(line.begin(), line.end());
  } catch (const json::parse_error& e) {
    // e.what() repeats the exception id; the byte and nlohmann's short reason are what help.
    return Bad(DropReason::kMalformedJson,
               absl::StrCat("(line): not valid JSON near byte ", e.byte));
  } catch (const json::exception& e) {
    // Not a parse_error: a number too large for a double (out_of_range 406), found by
    // tests/data/record_fuzz.cc; it used to escape and terminate prepare.
    return Bad(DropReason::kMalformedJson, absl::StrCat("(line): not valid JSON: ", e.what()));
  }
  if (!doc.is_object()) return WrongType("(line)", "a JSON object", doc);
  Record record;
  std::optional<BadRecord> bad;
  switch (format) {
    case DataFormat::kChat:
      bad = ParseChat(doc, require_assistant_turn, &record);
      break;
    case DataFormat::kPretokenized:
      bad = ParsePretokenized(doc, &record);
      break;
    case DataFormat::kText:
      bad = ParseText(doc, &record);
      break;
  }
  if (bad) return *std::move(bad);
  return record;
}

}  // namespace dflash::data

#include "common/data/chat_template.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/data/jinja_chat.h"
#include "nlohmann/json.hpp"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Decodes the code point at s[i] (valid UTF-8 assumed, as records are checked) and its length.
char32_t DecodeAt(absl::string_view s, size_t i, int* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n && i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  }
  *len = n;
  return cp;
}

// Python's str.isspace(), which Jinja's `trim` filter (str.strip()) uses.
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// str.strip() over UTF-8: leading and trailing Python whitespace removed.
absl::string_view PythonStrip(absl::string_view s) {
  size_t begin = 0;
  int len = 0;
  while (begin < s.size() && IsPythonSpace(DecodeAt(s, begin, &len))) begin += len;
  size_t end = begin;  // one past the last non-space code point
  for (size_t i = begin; i < s.size(); i += len) {
    if (!IsPythonSpace(DecodeAt(s, i, &len))) end = i + len;
  }
  return s.substr(begin, end - begin);
}

void Add(std::vector<TemplatePiece>* pieces, std::string text, bool supervised) {
  // Adjacent pieces with the same label are merged: fewer Normalize calls, same result.
  if (!pieces->empty() && pieces->back().supervised == supervised) {
    pieces->back().text += text;
  } else {
    pieces->push_back({std::move(text), supervised});
  }
}

void RenderChatml(absl::Span<const Message> messages, std::vector<TemplatePiece>* pieces) {
  for (const Message& m : messages) {
    const bool assistant = m.role == Role::kAssistant;
    Add(pieces, absl::StrCat(kImStart, RoleName(m.role), "\n"), false);
    Add(pieces, m.content, assistant);
    Add(pieces, std::string(kImEnd), assistant);
    Add(pieces, "\n", false);
  }
}

void RenderLlama3(absl::Span<const Message> messages, std::vector<TemplatePiece>* pieces) {
  Add(pieces, std::string(kBeginOfText), false);
  for (const Message& m : messages) {
    const bool assistant = m.role == Role::kAssistant;
    Add(pieces, absl::StrCat(kStartHeader, RoleName(m.role), kEndHeader, "\n\n"), false);
    Add(pieces, std::string(PythonStrip(m.content)), assistant);
    Add(pieces, std::string(kEotId), assistant);
  }
}

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The "chat_template" of tokenizer_config.json: a string, or (newer HF) a list of
// {"name", "template"} of which "default" is the one apply_chat_template uses.
absl::StatusOr<json> ReadConfig(const fs::path& config_path) {
  ASSIGN_OR_RETURN(std::string text, ReadText(config_path));
  json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": not a JSON object"));
  }
  return config;
}

absl::StatusOr<std::string> TemplateFromConfig(const fs::path& config_path, const json& config) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(config_path.string(), ": has no chat_template"));
  }
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& entry : *it) {
      // value("name", "") would throw on a non-string name; the file is not ours.
      const auto name = entry.is_object() ? entry.find("name") : entry.end();
      if (entry.is_object() && name != entry.end() && name->is_string() && *name == "default" &&
          entry.contains("template") && entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      config_path.string(), ": chat_template is neither a string nor a list with a 'default'"));
}

}  // namespace

absl::string_view ChatTemplateName(ChatTemplate tmpl) {
  switch (tmpl) {
    case ChatTemplate::kChatml:
      return "chatml";
    case ChatTemplate::kLlama3:
      return "llama3";
    case ChatTemplate::kJinja:
      return "jinja";
  }
  return "unknown";
}

absl::StatusOr<ChatTemplate> ParseChatTemplate(absl::string_view name) {
  for (ChatTemplate t : {ChatTemplate::kChatml, ChatTemplate::kLlama3}) {
    if (ChatTemplateName(t) == name) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat template '", name, "' (expected auto, chatml or llama3)"));
}

absl::StatusOr<ChatTemplate> DetectChatTemplate(absl::string_view jinja) {
  const bool chatml = absl::StrContains(jinja, kImStart) && absl::StrContains(jinja, kImEnd);
  const bool llama3 = absl::StrContains(jinja, kStartHeader) && absl::StrContains(jinja, kEotId);
  if (chatml && !llama3) return ChatTemplate::kChatml;
  if (llama3 && !chatml) return ChatTemplate::kLlama3;
  return absl::InvalidArgumentError(
      chatml ? "the chat template has both ChatML and Llama-3 markers"
             : "the chat template is neither ChatML (<|im_start|>, <|im_end|>) nor Llama-3 "
               "(<|start_header_id|>, <|eot_id|>)");
}

std::string RecordedTemplateName(ChatTemplate kind, absl::string_view thinking) {
  return absl::StrCat(ChatTemplateName(kind), thinking == "on"    ? "+think"
                                              : thinking == "off" ? "-think"
                                                                  : "");
}

std::string RecordedThinking(absl::string_view recorded_name) {
  return absl::EndsWith(recorded_name, "+think")   ? "on"
         : absl::EndsWith(recorded_name, "-think") ? "off"
                                                   : "auto";
}

absl::StatusOr<ResolvedChatTemplate> ResolveChatTemplate(absl::string_view setting,
                                                         const fs::path& tokenizer_json,
                                                         const fs::path& template_dir,
                                                         absl::string_view thinking) {
  if (thinking != "auto" && thinking != "on" && thinking != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.thinking: must be auto, on or off, got '", thinking, "'"));
  }
  if (setting != "auto") {
    ASSIGN_OR_RETURN(ChatTemplate builtin, ParseChatTemplate(setting));
    if (thinking != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat("data.thinking: ", thinking, ": the built-in ", setting,
                       " template has no thinking switch (use data.chat_template: auto, the "
                       "target's own template, or data.thinking: auto)"));
    }
    return ResolvedChatTemplate(builtin);
  }
  const fs::path dir = template_dir.empty() ? tokenizer_json.parent_path() : template_dir;
  const fs::path jinja_path = dir / "chat_template.jinja";
  const fs::path config_path = dir / "tokenizer_config.json";
  const std::string advice =
      "; set data.chat_template to chatml or llama3 (data.chat_template: auto renders the "
      "template of the target checkpoint)";
  std::error_code ec;
  absl::StatusOr<json> config = ReadConfig(config_path);
  if (!config.ok() && fs::exists(config_path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data.chat_template: auto: ", config.status().message(), advice));
  }
  const json specials = config.ok() ? *config : json();
  absl::StatusOr<std::string> source = absl::NotFoundError("");
  std::string origin;
  if (fs::exists(jinja_path, ec)) {
    source = ReadText(jinja_path);
    origin = jinja_path.string();
  } else if (config.ok()) {
    source = TemplateFromConfig(config_path, *config);
    origin = absl::StrCat(config_path.string(), ":chat_template");
  } else {
    source = config.status();
  }
  if (!source.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.chat_template: auto found no chat template (looked at ", jinja_path.string(), " and ",
        config_path.string(), ": ", source.status().message(), ")", advice));
  }
  std::optional<bool> enable_thinking;
  if (thinking != "auto") {
    // A template that never reads the switch would render the same either way: refused, so that
    // the setting never silently does nothing.
    if (source->find("enable_thinking") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.thinking: ", thinking, ": ", origin,
                       " has no enable_thinking switch; set data.thinking: auto"));
    }
    enable_thinking = thinking == "on";
  }
  absl::StatusOr<std::shared_ptr<const JinjaChatTemplate>> tmpl =
      JinjaChatTemplate::Create(*std::move(source), origin, specials, enable_thinking);
  if (!tmpl.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.chat_template: auto: the template cannot be used: ", tmpl.status().message(),
        advice));
  }
  return ResolvedChatTemplate(*std::move(tmpl));
}

std::vector<TemplatePiece> RenderChat(ChatTemplate tmpl, absl::Span<const Message> messages) {
  std::vector<TemplatePiece> pieces;
  if (tmpl == ChatTemplate::kChatml) {
    RenderChatml(messages, &pieces);
  } else {
    RenderLlama3(messages, &pieces);
  }
  return pieces;
}

std::string RenderChatText(ChatTemplate tmpl, absl::Span<const Message> messages) {
  std::string out;
  for (const TemplatePiece& p : RenderChat(tmpl, messages)) out += p.text;
  return out;
}

absl::StatusOr<std::vector<TemplatePiece>> RenderChatPieces(const ResolvedChatTemplate& tmpl,
                                                            absl::Span<const Message> messages) {
  if (tmpl.kind == ChatTemplate::kJinja) return tmpl.jinja->RenderPieces(messages);
  return RenderChat(tmpl.kind, messages);
}

absl::StatusOr<std::string> RenderPromptText(const ResolvedChatTemplate& tmpl,
                                             absl::Span<const Message> messages) {
  switch (tmpl.kind) {
    case ChatTemplate::kJinja:
      return tmpl.jinja->Render(messages, /*add_generation_prompt=*/true);
    case ChatTemplate::kChatml:
      return absl::StrCat(RenderChatText(tmpl.kind, messages), kImStart, "assistant\n");
    case ChatTemplate::kLlama3:
      return absl::StrCat(RenderChatText(tmpl.kind, messages), kStartHeader, "assistant",
                          kEndHeader, "\n\n");
  }
  return DFLASH_INTERNAL_ERROR("unknown chat template");
}

}  // namespace dflash::data

#include "common/data/jinja_chat.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dflash::data {
namespace {

// A special token as tokenizer_config.json writes it: a string or an AddedToken object.
const nlohmann::json* TokenText(const nlohmann::json& v) {
  if (v.is_string()) return &v;
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return &v["content"];
  return nullptr;
}

// What transformers' special_tokens_map holds: the named tokens that are set, and the additional
// special tokens when there are any.
jinja::ValueDict SpecialTokens(const nlohmann::json& config) {
  jinja::ValueDict out;
  if (!config.is_object()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    if (const nlohmann::json* text = TokenText(*it)) {
      out.emplace_back(key, jinja::Value(text->get<std::string>()));
    }
  }
  auto extra = config.find("additional_special_tokens");
  if (extra != config.end() && extra->is_array() && !extra->empty()) {
    jinja::ValueList list;
    for (const nlohmann::json& t : *extra) {
      if (const nlohmann::json* text = TokenText(t)) list.push_back(text->get<std::string>());
    }
    out.emplace_back("additional_special_tokens", jinja::Value::List(std::move(list)));
  }
  return out;
}

size_t TrimTrailingSpace(absl::string_view s, size_t begin, size_t end) {
  while (end > begin &&
         (s[end - 1] == ' ' || s[end - 1] == '\n' || s[end - 1] == '\t' || s[end - 1] == '\r')) {
    --end;
  }
  return end;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const JinjaChatTemplate>> JinjaChatTemplate::Create(
    std::string source, std::string origin, const nlohmann::json& tokenizer_config,
    std::optional<bool> enable_thinking) {
  ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::Parse(std::move(source), origin));
  auto t = std::shared_ptr<JinjaChatTemplate>(new JinjaChatTemplate(std::move(tmpl)));
  t->special_tokens_ = SpecialTokens(tokenizer_config);
  t->enable_thinking_ = enable_thinking;
  return std::shared_ptr<const JinjaChatTemplate>(std::move(t));
}

absl::StatusOr<std::string> JinjaChatTemplate::Render(absl::Span<const Message> messages,
                                                      bool add_generation_prompt) const {
  jinja::ValueList list;
  for (const Message& m : messages) {
    list.push_back(jinja::Value::Dict(
        {{"role", jinja::Value(std::string(RoleName(m.role)))}, {"content", m.content}}));
  }
  jinja::ValueDict vars = special_tokens_;
  vars.emplace_back("messages", jinja::Value::List(std::move(list)));
  vars.emplace_back("add_generation_prompt", jinja::Value(add_generation_prompt));
  vars.emplace_back("tools", jinja::Value::None());
  vars.emplace_back("documents", jinja::Value::None());
  if (enable_thinking_) vars.emplace_back("enable_thinking", jinja::Value(*enable_thinking_));
  return tmpl_.Render(vars);
}

absl::StatusOr<std::vector<TemplatePiece>> JinjaChatTemplate::RenderPieces(
    absl::Span<const Message> messages) const {
  ASSIGN_OR_RETURN(std::string full, Render(messages, /*add_generation_prompt=*/false));
  std::vector<TemplatePiece> pieces;
  size_t done = 0;  // end of the text already placed in pieces
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != Role::kAssistant) continue;
    const std::string where = absl::StrCat("messages[", i, "] (an assistant answer)");
    ASSIGN_OR_RETURN(std::string before, Render(messages.subspan(0, i), true));
    ASSIGN_OR_RETURN(std::string through, Render(messages.subspan(0, i + 1), false));
    if (!absl::StartsWith(through, before)) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin(), ": not prefix-consistent at ", where,
          ": the conversation before it rendered with add_generation_prompt=true is not a prefix "
          "of the conversation through it"));
    }
    if (!absl::StartsWith(full, through)) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin(), ": not prefix-consistent at ", where,
          ": the template renders this answer differently once later messages follow (it "
          "rewrites earlier turns, e.g. drops their reasoning); train on conversations that end "
          "with this answer, or set data.chat_template to a built-in template"));
    }
    if (before.size() < done) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin(), ": not prefix-consistent at ", where,
                       ": the generation prompt overlaps the previous answer"));
    }
    const size_t end = TrimTrailingSpace(through, before.size(), through.size());
    if (before.size() > done) pieces.push_back({full.substr(done, before.size() - done), false});
    if (end > before.size())
      pieces.push_back({full.substr(before.size(), end - before.size()), true});
    done = std::max(done, end);
  }
  if (full.size() > done) pieces.push_back({full.substr(done), false});
  return pieces;
}

}  // namespace dflash::data

// A checkpoint's own Jinja chat template (data.chat_template: auto), rendered with the
// interpreter of common/jinja exactly as transformers' apply_chat_template renders it: the
// variables are messages ({role, content} dicts), add_generation_prompt, tools=None,
// documents=None and the special tokens of tokenizer_config.json (bos_token, eos_token, unk_token,
// sep_token, pad_token, cls_token, mask_token, additional_special_tokens); enable_thinking when
// data.thinking sets it (on / off), else undefined like every other template switch.
//
// Loss mask (RenderPieces). For each assistant message i the template renders the conversation
// before it with add_generation_prompt=true (A) and the conversation through it (B); the
// supervised text is B after A, without the whitespace that follows the turn's end token (so the
// answer's content, any reasoning block the template writes, and the end-of-turn token). A must be
// a prefix of B and B a prefix of the whole conversation's rendering; a template that rewrites
// earlier turns once later ones follow (Qwen3 drops the reasoning of answers before the last user
// message) is not prefix-consistent there, and the record is refused naming the message.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/data/chat_template.h"
#include "common/data/records.h"
#include "common/jinja/template.h"
#include "nlohmann/json.hpp"

namespace dflash::data {

class JinjaChatTemplate {
 public:
  // `origin` names the file (and field) the template came from in errors; `tokenizer_config` is
  // the tokenizer_config.json object for the special tokens (null: none). A template that does not
  // parse is an InvalidArgument error naming origin, line and column.
  static absl::StatusOr<std::shared_ptr<const JinjaChatTemplate>> Create(
      std::string source, std::string origin, const nlohmann::json& tokenizer_config,
      std::optional<bool> enable_thinking = std::nullopt);

  // The rendered conversation.
  absl::StatusOr<std::string> Render(absl::Span<const Message> messages,
                                     bool add_generation_prompt) const;
  // The conversation as pieces labelled supervised or not (see the file comment).
  absl::StatusOr<std::vector<TemplatePiece>> RenderPieces(absl::Span<const Message> messages) const;

  const std::string& origin() const { return tmpl_.name(); }

 private:
  explicit JinjaChatTemplate(jinja::Template tmpl) : tmpl_(std::move(tmpl)) {}

  jinja::Template tmpl_;
  jinja::ValueDict special_tokens_;
  std::optional<bool> enable_thinking_;
};

}  // namespace dflash::data

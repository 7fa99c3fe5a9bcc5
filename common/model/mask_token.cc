#include "common/model/mask_token.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dflash::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const json& EmptyObject() {
  static const json* const empty = new json(json::object());
  return *empty;
}

// The parsed file, std::nullopt when it does not exist; an error when it is not JSON.
absl::StatusOr<std::optional<json>> ReadJson(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::optional<json>();
  std::ostringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not valid JSON"));
  }
  return std::optional<json>(std::move(j));
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

// A token named in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> TokenText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

struct TokenizerTokens {
  std::vector<std::pair<int64_t, std::string>> added;  // (id, content) of special added tokens
  json added_all = json::array();
  int64_t count = 0;  // one past the largest id (vocabulary and added tokens)
  std::optional<int64_t> Find(const json& model, const std::string& text) const {
    for (const json& a : added_all) {
      if (a.is_object() && a.value("content", "") == text && a.contains("id") &&
          a["id"].is_number_integer()) {
        return a["id"].get<int64_t>();
      }
    }
    if (model.is_object() && model.contains("vocab") && model["vocab"].is_object() &&
        model["vocab"].contains(text) && model["vocab"][text].is_number_integer()) {
      return model["vocab"][text].get<int64_t>();
    }
    return std::nullopt;
  }
};

TokenizerTokens ReadTokens(const json& tok) {
  TokenizerTokens t;
  const json& model = tok.contains("model") ? tok["model"] : EmptyObject();
  if (model.is_object() && model.contains("vocab")) {
    const json& vocab = model["vocab"];
    if (vocab.is_object()) {  // BPE, WordPiece, WordLevel: token -> id
      for (const auto& [text, id] : vocab.items()) {
        if (id.is_number_integer()) t.count = std::max(t.count, id.get<int64_t>() + 1);
      }
    } else if (vocab.is_array()) {  // Unigram: [[token, score], ...] in id order
      t.count = static_cast<int64_t>(vocab.size());
    }
  }
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    t.added_all = tok["added_tokens"];
    for (const json& a : t.added_all) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()) continue;
      const int64_t id = a["id"].get<int64_t>();
      t.count = std::max(t.count, id + 1);
      if (a.value("special", false) && a.contains("content") && a["content"].is_string()) {
        t.added.emplace_back(id, a["content"].get<std::string>());
      }
    }
  }
  std::sort(t.added.begin(), t.added.end());
  return t;
}

// Ids given as an integer or a list of integers (config.json's eos_token_id may be either).
void AddIds(const json& v, std::set<int64_t>* ids) {
  if (v.is_number_integer()) ids->insert(v.get<int64_t>());
  if (v.is_array()) {
    for (const json& x : v) AddIds(x, ids);
  }
}

// The ids of the tokens that frame or pad text: bos, eos, pad, unk, sep, cls.
void FramingIds(const json& obj, std::set<int64_t>* ids) {
  if (!obj.is_object()) return;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                          "sep_token_id", "cls_token_id"}) {
    if (obj.contains(key)) AddIds(obj[key], ids);
  }
  if (obj.contains("text_config")) FramingIds(obj["text_config"], ids);
}

bool NamedReserved(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return absl::StrContains(lower, "reserved") || absl::StrContains(lower, "unused");
}

}  // namespace

absl::StatusOr<MaskTokenChoice> MaskTokenFromTokenizer(const fs::path& tokenizer_json,
                                                       int64_t vocab_size) {
  const fs::path dir = tokenizer_json.parent_path();
  absl::StatusOr<std::optional<json>> tok = ReadJson(tokenizer_json);
  if (!tok.ok()) return tok.status();
  if (!tok->has_value()) {
    return absl::NotFoundError(absl::StrCat(tokenizer_json.string(), " does not exist"));
  }
  const json& j = **tok;
  const json& model = j.contains("model") ? j["model"] : EmptyObject();
  const TokenizerTokens tokens = ReadTokens(**tok);
  absl::StatusOr<std::optional<json>> config = ReadJson(dir / "tokenizer_config.json");
  if (!config.ok()) return config.status();
  const json tc = config->value_or(json::object());

  // 1. The tokenizer's own mask token.
  if (tc.is_object() && tc.contains("mask_token")) {
    if (std::optional<std::string> text = TokenText(tc["mask_token"])) {
      std::optional<int64_t> id = tokens.Find(model, *text);
      if (id && *id >= 0 && *id < vocab_size) {
        return MaskTokenChoice{*id, *text, "the tokenizer's mask token"};
      }
    }
  }
  // 2. An embedding row past every token: the model was never trained to write it.
  if (tokens.count > 0 && tokens.count < vocab_size) {
    return MaskTokenChoice{
        tokens.count, "",
        absl::StrCat("the first embedding row past the tokenizer's ", tokens.count, " tokens")};
  }
  // 3. A special token that neither the chat template nor the framing of text uses.
  std::string templates = ReadText(dir / "chat_template.jinja");
  if (tc.is_object() && tc.contains("chat_template")) {
    const json& t = tc["chat_template"];
    if (t.is_string()) absl::StrAppend(&templates, t.get<std::string>());
    if (t.is_array()) {
      for (const json& e : t) {
        if (e.is_object() && e.contains("template") && e["template"].is_string()) {
          absl::StrAppend(&templates, e["template"].get<std::string>());
        }
      }
    }
  }
  std::set<int64_t> framing;
  if (tc.is_object()) {
    for (const char* key :
         {"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token"}) {
      if (!tc.contains(key)) continue;
      if (std::optional<std::string> text = TokenText(tc[key])) {
        if (std::optional<int64_t> id = tokens.Find(model, *text)) framing.insert(*id);
      }
    }
  }
  for (const char* file : {"config.json", "generation_config.json"}) {
    absl::StatusOr<std::optional<json>> j = ReadJson(dir / file);
    if (j.ok() && j->has_value()) FramingIds(**j, &framing);
  }
  std::optional<std::pair<int64_t, std::string>> reserved, other;
  for (const auto& [id, text] : tokens.added) {
    if (id < 0 || id >= vocab_size || framing.count(id) > 0) continue;
    if (absl::StrContains(templates, text)) continue;
    if (NamedReserved(text)) {
      if (!reserved) reserved.emplace(id, text);
    } else if (!other) {
      other.emplace(id, text);
    }
  }
  if (reserved)
    return MaskTokenChoice{reserved->first, reserved->second, "a reserved special token"};
  if (other) {
    return MaskTokenChoice{other->first, other->second,
                           "the first special token the chat template and text framing never use"};
  }
  return absl::NotFoundError(absl::StrCat(
      tokenizer_json.string(), " names no mask token, its ", tokens.count,
      " tokens fill the target's ", vocab_size,
      " embedding rows, and every special token it adds is used by the chat template or frames "
      "text (bos, eos, pad, unk)"));
}

}  // namespace dflash::model

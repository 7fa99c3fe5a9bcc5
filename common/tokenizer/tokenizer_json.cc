#include "common/tokenizer/tokenizer_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/unicode.h"

namespace dflash::tokenizer {
namespace {

using json = nlohmann::json;

// Typed access to members, with errors of the form "<source>: <path>: <message>".
class Reader {
 public:
  explicit Reader(absl::string_view source) : source_(source.data(), source.size()) {}

  absl::Status Error(absl::string_view path, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", path, ": ", message));
  }

  // The member, or nullptr when it is absent or null.
  static const json* Find(const json& obj, absl::string_view key) {
    auto it = obj.find(std::string(key.data(), key.size()));
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  absl::StatusOr<bool> Bool(const json& obj, absl::string_view path, absl::string_view key,
                            bool fallback) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return TypeError(path, key, "a boolean", *v);
    return v->get<bool>();
  }

  absl::StatusOr<std::string> String(const json& obj, absl::string_view path,
                                     absl::string_view key) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return Error(Join(path, key), "missing (expected a string)");
    if (!v->is_string()) return TypeError(path, key, "a string", *v);
    return v->get<std::string>();
  }

  absl::StatusOr<const json*> Typed(const json& obj, absl::string_view path, absl::string_view key,
                                    json::value_t type, absl::string_view expected) const {
    const json* v = Find(obj, key);
    if (v == nullptr)
      return Error(Join(path, key), absl::StrCat("missing (expected ", expected, ")"));
    if (v->type() != type) return TypeError(path, key, expected, *v);
    return v;
  }

  absl::Status TypeError(absl::string_view path, absl::string_view key, absl::string_view expected,
                         const json& got) const {
    return Error(Join(path, key), absl::StrCat("expected ", expected, ", got ", got.type_name()));
  }

  static std::string Join(absl::string_view path, absl::string_view key) {
    return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
  }

 private:
  std::string source_;
};

absl::Status ParseNormalizer(const Reader& r, const json& n, const std::string& path, bool* nfc) {
  if (n.is_null()) return absl::OkStatus();
  if (!n.is_object()) return r.Error(path, absl::StrCat("expected an object, got ", n.type_name()));
  ASSIGN_OR_RETURN(const std::string type, r.String(n, path, "type"));
  if (type == "NFC") {
    *nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const json* list,
                     r.Typed(n, path, "normalizers", json::value_t::array, "an array"));
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          ParseNormalizer(r, (*list)[i], absl::StrCat(path, ".normalizers[", i, "]"), nfc));
    }
    return absl::OkStatus();
  }
  return r.Error(path + ".type", absl::StrCat("normalizer '", type,
                                              "' is not supported (supported: NFC, Sequence)"));
}

absl::Status ParseByteLevel(const Reader& r, const json& n, const std::string& path,
                            PreTokenizerConfig* out) {
  // HF's defaults for a ByteLevel without these fields are true.
  ASSIGN_OR_RETURN(out->add_prefix_space, r.Bool(n, path, "add_prefix_space", true));
  ASSIGN_OR_RETURN(out->use_regex, r.Bool(n, path, "use_regex", true));
  return absl::OkStatus();
}

// A literal as an Oniguruma pattern (what HF's regex::escape does for a String pattern).
std::string EscapeRegex(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

absl::Status ParseSplit(const Reader& r, const json& n, const std::string& path,
                        PreTokenizerConfig* out) {
  ASSIGN_OR_RETURN(const json* pattern,
                   r.Typed(n, path, "pattern", json::value_t::object, "an object"));
  const std::string pattern_path = path + ".pattern";
  const bool is_regex = Reader::Find(*pattern, "Regex") != nullptr;
  if (!is_regex && Reader::Find(*pattern, "String") == nullptr) {
    return r.Error(pattern_path, "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  ASSIGN_OR_RETURN(std::string regex,
                   r.String(*pattern, pattern_path, is_regex ? "Regex" : "String"));
  if (!is_regex) {
    if (regex.empty()) return r.Error(pattern_path + ".String", "empty");
    regex = EscapeRegex(regex);  // HF matches the string literally
  }
  ASSIGN_OR_RETURN(const std::string behavior, r.String(n, path, "behavior"));
  if (behavior != "Isolated") {
    return r.Error(path + ".behavior", absl::StrCat("behavior '", behavior,
                                                    "' is not supported (supported: Isolated)"));
  }
  ASSIGN_OR_RETURN(const bool invert, r.Bool(n, path, "invert", false));
  if (invert) return r.Error(path + ".invert", "invert: true is not supported");
  out->split_patterns.push_back(std::move(regex));
  out->split_fields.push_back(pattern_path + (is_regex ? ".Regex" : ".String"));
  return absl::OkStatus();
}

// Digits splits off every code point that Rust's char::is_numeric takes (categories Nd, Nl, No):
// alone with individual_digits, else in runs. That is \p{N} as Oniguruma reads it (see
// TranslateOnigPattern) plus the 13 code points Rust's newer Unicode tables add (Unicode 17); the
// parity test compares the whole of Unicode with HF's Digits.
constexpr char kRustNumeric[] = R"([\p{N}\x{11DE0}-\x{11DE9}\x{16FF4}-\x{16FF6}])";

absl::Status ParseDigits(const Reader& r, const json& n, const std::string& path,
                         PreTokenizerConfig* out) {
  ASSIGN_OR_RETURN(const bool individual, r.Bool(n, path, "individual_digits", false));
  out->split_patterns.push_back(individual ? std::string(kRustNumeric)
                                           : absl::StrCat(kRustNumeric, "+"));
  out->split_fields.push_back(path);
  return absl::OkStatus();
}

constexpr char kSupportedPreTokenizers[] =
    "supported: ByteLevel, or a Sequence of Split and Digits steps then one ByteLevel step last";

absl::Status ParsePreTokenizer(const Reader& r, const json& root, PreTokenizerConfig* out) {
  const std::string path = "pre_tokenizer";
  ASSIGN_OR_RETURN(const json* n, r.Typed(root, "", path, json::value_t::object, "an object"));
  ASSIGN_OR_RETURN(const std::string type, r.String(*n, path, "type"));
  if (type == "ByteLevel") return ParseByteLevel(r, *n, path, out);
  if (type != "Sequence") {
    return r.Error(path + ".type", absl::StrCat("pre-tokenizer '", type, "' is not supported (",
                                                kSupportedPreTokenizers, ")"));
  }
  ASSIGN_OR_RETURN(const json* list,
                   r.Typed(*n, path, "pretokenizers", json::value_t::array, "an array"));
  if (list->empty()) return r.Error(path + ".pretokenizers", "empty; a ByteLevel step is required");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string item_path = absl::StrCat(path, ".pretokenizers[", i, "]");
    const json& item = (*list)[i];
    if (!item.is_object()) return r.Error(item_path, "expected an object");
    ASSIGN_OR_RETURN(const std::string item_type, r.String(item, item_path, "type"));
    const bool last = i + 1 == list->size();
    if (item_type == "Split" && !last) {
      RETURN_IF_ERROR(ParseSplit(r, item, item_path, out));
    } else if (item_type == "Digits" && !last) {
      RETURN_IF_ERROR(ParseDigits(r, item, item_path, out));
    } else if (item_type == "ByteLevel" && last) {
      RETURN_IF_ERROR(ParseByteLevel(r, item, item_path, out));
    } else {
      return r.Error(item_path + ".type",
                     absl::StrCat("pre-tokenizer '", item_type, "' is not supported here (",
                                  kSupportedPreTokenizers, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseReplace(const Reader& r, const json& n, const std::string& path,
                          DecoderStep* step) {
  ASSIGN_OR_RETURN(const json* pattern,
                   r.Typed(n, path, "pattern", json::value_t::object, "an object"));
  const std::string pattern_path = path + ".pattern";
  step->pattern_is_regex = Reader::Find(*pattern, "Regex") != nullptr;
  if (!step->pattern_is_regex && Reader::Find(*pattern, "String") == nullptr) {
    return r.Error(pattern_path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  const char* key = step->pattern_is_regex ? "Regex" : "String";
  ASSIGN_OR_RETURN(step->pattern, r.String(*pattern, pattern_path, key));
  if (step->pattern.empty()) return r.Error(absl::StrCat(pattern_path, ".", key), "empty");
  step->field = absl::StrCat(pattern_path, ".", key);
  ASSIGN_OR_RETURN(step->content, r.String(n, path, "content"));
  return absl::OkStatus();
}

absl::Status ParseStrip(const Reader& r, const json& n, const std::string& path,
                        DecoderStep* step) {
  ASSIGN_OR_RETURN(const std::string content, r.String(n, path, "content"));
  if (content.empty() || unicode::FindInvalidUtf8(content) != unicode::kValid) {
    return r.Error(path + ".content", "expected one character");
  }
  int len = 0;
  step->strip_char = unicode::DecodeAt(content, 0, &len);
  if (static_cast<size_t>(len) != content.size()) {
    return r.Error(path + ".content", "expected one character");
  }
  ASSIGN_OR_RETURN(const json* start, r.Typed(n, path, "start", json::value_t::number_unsigned,
                                              "a non-negative integer"));
  ASSIGN_OR_RETURN(const json* stop, r.Typed(n, path, "stop", json::value_t::number_unsigned,
                                             "a non-negative integer"));
  step->strip_start = start->get<size_t>();
  step->strip_stop = stop->get<size_t>();
  return absl::OkStatus();
}

absl::Status ParseDecoderNode(const Reader& r, const json& n, const std::string& path,
                              std::vector<DecoderStep>* out) {
  if (!n.is_object()) return r.Error(path, absl::StrCat("expected an object, got ", n.type_name()));
  ASSIGN_OR_RETURN(const std::string type, r.String(n, path, "type"));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const json* list,
                     r.Typed(n, path, "decoders", json::value_t::array, "an array"));
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          ParseDecoderNode(r, (*list)[i], absl::StrCat(path, ".decoders[", i, "]"), out));
    }
    return absl::OkStatus();
  }
  DecoderStep step;
  step.field = path;
  if (type == "ByteLevel") {
    step.type = DecoderStep::Type::kByteLevel;
  } else if (type == "ByteFallback") {
    step.type = DecoderStep::Type::kByteFallback;
  } else if (type == "Fuse") {
    step.type = DecoderStep::Type::kFuse;
  } else if (type == "Replace") {
    step.type = DecoderStep::Type::kReplace;
    RETURN_IF_ERROR(ParseReplace(r, n, path, &step));
  } else if (type == "Strip") {
    step.type = DecoderStep::Type::kStrip;
    RETURN_IF_ERROR(ParseStrip(r, n, path, &step));
  } else {
    return r.Error(path + ".type",
                   absl::StrCat("decoder '", type,
                                "' is not supported (supported: ByteLevel, ByteFallback, Fuse, "
                                "Replace, Strip, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const Reader& r, const json& root, std::vector<DecoderStep>* out) {
  ASSIGN_OR_RETURN(const json* n, r.Typed(root, "", "decoder", json::value_t::object, "an object"));
  return ParseDecoderNode(r, *n, "decoder", out);
}

// Encode runs as HF's encode(text, add_special_tokens=False): a post-processor adds no tokens
// then (ByteLevel only trims offsets), so the supported ones are validated, not applied.
absl::Status ParseTemplate(const Reader& r, const json& n, const std::string& path) {
  ASSIGN_OR_RETURN(const json* specials,
                   r.Typed(n, path, "special_tokens", json::value_t::object, "an object"));
  for (const char* key : {"single", "pair"}) {
    ASSIGN_OR_RETURN(const json* list, r.Typed(n, path, key, json::value_t::array, "an array"));
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string item_path = absl::StrCat(path, ".", key, "[", i, "]");
      const json& item = (*list)[i];
      if (!item.is_object() || item.size() != 1) {
        return r.Error(item_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
      const std::string kind = item.begin().key();
      if (kind != "Sequence" && kind != "SpecialToken") {
        return r.Error(item_path, absl::StrCat("'", kind, "' is not a template piece"));
      }
      const std::string piece_path = absl::StrCat(item_path, ".", kind);
      ASSIGN_OR_RETURN(const std::string id, r.String(item.begin().value(), piece_path, "id"));
      if (kind == "SpecialToken" && !specials->contains(id)) {
        return r.Error(piece_path + ".id", absl::StrCat("'", id, "' is not in special_tokens"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const Reader& r, const json& n, const std::string& path) {
  if (n.is_null()) return absl::OkStatus();
  if (!n.is_object()) return r.Error(path, absl::StrCat("expected an object, got ", n.type_name()));
  ASSIGN_OR_RETURN(const std::string type, r.String(n, path, "type"));
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "TemplateProcessing") return ParseTemplate(r, n, path);
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const json* list,
                     r.Typed(n, path, "processors", json::value_t::array, "an array"));
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          ParsePostProcessor(r, (*list)[i], absl::StrCat(path, ".processors[", i, "]")));
    }
    return absl::OkStatus();
  }
  return r.Error(path + ".type",
                 absl::StrCat("post-processor '", type,
                              "' is not supported (supported: ByteLevel, TemplateProcessing, "
                              "Sequence)"));
}

absl::Status ParseVocab(const Reader& r, const json& model, TokenizerSpec* spec) {
  ASSIGN_OR_RETURN(const json* vocab,
                   r.Typed(model, "model", "vocab", json::value_t::object, "an object"));
  std::vector<const std::string*> owner;  // by id, to name both tokens of a duplicate id
  spec->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string path = absl::StrCat("model.vocab['", it.key(), "']");
    if (!it->is_number_integer()) {
      return r.Error(path, absl::StrCat("expected an integer id, got ", it->type_name()));
    }
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id > kMaxTokenId) {
      return r.Error(path, absl::StrCat("id ", id, " is outside [0, ", kMaxTokenId, "]"));
    }
    if (owner.size() <= static_cast<size_t>(id)) owner.resize(static_cast<size_t>(id) + 1);
    if (owner[id] != nullptr) {
      return r.Error(path, absl::StrCat("id ", id, " is also the id of '", *owner[id], "'"));
    }
    owner[id] = &it.key();
    spec->vocab.emplace(it.key(), static_cast<int32_t>(id));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, std::string>> MergeParts(const Reader& r, const json& m,
                                                               const std::string& path) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');  // HF splits at the first space
    if (space == std::string::npos) return r.Error(path, "expected \"left right\", got no space");
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return r.Error(
      path, absl::StrCat("expected \"left right\" or [\"left\", \"right\"], got ", m.type_name()));
}

absl::Status ParseMerges(const Reader& r, const json& model, TokenizerSpec* spec) {
  ASSIGN_OR_RETURN(const json* merges,
                   r.Typed(model, "model", "merges", json::value_t::array, "an array"));
  absl::flat_hash_map<uint64_t, size_t> seen;
  seen.reserve(merges->size());
  auto id_of = [&](const std::string& token, const std::string& path,
                   absl::string_view what) -> absl::StatusOr<int32_t> {
    auto it = spec->vocab.find(token);
    if (it == spec->vocab.end()) {
      return r.Error(path, absl::StrCat(what, " '", token, "' is not in the vocabulary"));
    }
    return it->second;
  };
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string path = absl::StrCat("model.merges[", i, "]");
    ASSIGN_OR_RETURN(const auto parts, MergeParts(r, (*merges)[i], path));
    ASSIGN_OR_RETURN(const int32_t left, id_of(parts.first, path, "token"));
    ASSIGN_OR_RETURN(const int32_t right, id_of(parts.second, path, "token"));
    ASSIGN_OR_RETURN(const int32_t result, id_of(parts.first + parts.second, path, "merged token"));
    const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
    auto [it, inserted] = seen.emplace(key, i);
    if (!inserted) {
      return r.Error(path, absl::StrCat("duplicate of model.merges[", it->second, "]"));
    }
    spec->merges.emplace_back(left, right);
    spec->merge_results.push_back(result);
  }
  return absl::OkStatus();
}

absl::Status CheckUnsupportedModelOptions(const Reader& r, const json& model) {
  if (Reader::Find(model, "dropout") != nullptr) {
    return r.Error("model.dropout", "BPE dropout is not supported (expected null)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = Reader::Find(model, key);
    if (v != nullptr && !(v->is_string() && v->get_ref<const std::string&>().empty())) {
      return r.Error(absl::StrCat("model.", key), "only null or \"\" is supported");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const Reader& r, const json& root, TokenizerSpec* spec) {
  ASSIGN_OR_RETURN(const json* model,
                   r.Typed(root, "", "model", json::value_t::object, "an object"));
  ASSIGN_OR_RETURN(const std::string type, r.String(*model, "model", "type"));
  if (type != "BPE") {
    return r.Error("model.type",
                   absl::StrCat("model '", type, "' is not supported (supported: BPE)"));
  }
  RETURN_IF_ERROR(CheckUnsupportedModelOptions(r, *model));
  ASSIGN_OR_RETURN(spec->ignore_merges, r.Bool(*model, "model", "ignore_merges", false));
  ASSIGN_OR_RETURN(spec->byte_fallback, r.Bool(*model, "model", "byte_fallback", false));
  ASSIGN_OR_RETURN(spec->fuse_unk, r.Bool(*model, "model", "fuse_unk", false));
  RETURN_IF_ERROR(ParseVocab(r, *model, spec));
  if (const json* unk = Reader::Find(*model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) return r.TypeError("model", "unk_token", "a string or null", *unk);
    auto it = spec->vocab.find(unk->get_ref<const std::string&>());
    if (it == spec->vocab.end()) {
      return r.Error("model.unk_token",
                     absl::StrCat("'", unk->get<std::string>(), "' is not in the vocabulary"));
    }
    spec->unk_id = it->second;
  }
  return ParseMerges(r, *model, spec);
}

absl::StatusOr<AddedToken> ParseAddedToken(const Reader& r, const json& t,
                                           const std::string& path) {
  if (!t.is_object()) return r.Error(path, absl::StrCat("expected an object, got ", t.type_name()));
  AddedToken token;
  ASSIGN_OR_RETURN(const json* id, r.Typed(t, path, "id", json::value_t::number_unsigned,
                                           "a non-negative integer"));
  if (id->get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)) {
    return r.Error(path + ".id",
                   absl::StrCat("id ", id->get<uint64_t>(), " is above ", kMaxTokenId));
  }
  token.id = static_cast<int32_t>(id->get<uint64_t>());
  ASSIGN_OR_RETURN(token.content, r.String(t, path, "content"));
  if (token.content.empty()) return r.Error(path + ".content", "empty");
  // HF's AddedToken defaults.
  ASSIGN_OR_RETURN(token.special, r.Bool(t, path, "special", false));
  ASSIGN_OR_RETURN(token.lstrip, r.Bool(t, path, "lstrip", false));
  ASSIGN_OR_RETURN(token.rstrip, r.Bool(t, path, "rstrip", false));
  ASSIGN_OR_RETURN(token.single_word, r.Bool(t, path, "single_word", false));
  ASSIGN_OR_RETURN(token.normalized, r.Bool(t, path, "normalized", true));
  return token;
}

// HF ignores the ids in the file and assigns them again (AddedVocabulary::add_tokens): a token
// already in the vocabulary keeps that id, others count up from the vocabulary's size. A file whose
// ids disagree would tokenize differently in HF than it reads, so it is refused.
absl::Status ParseAddedTokens(const Reader& r, const json& root, TokenizerSpec* spec) {
  const json* list = Reader::Find(root, "added_tokens");
  if (list == nullptr) return absl::OkStatus();
  if (!list->is_array()) return r.TypeError("", "added_tokens", "an array", *list);
  const int64_t model_size = static_cast<int64_t>(spec->vocab.size());
  absl::flat_hash_map<std::string, size_t> by_content;
  int64_t max_added = -1;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    ASSIGN_OR_RETURN(AddedToken token, ParseAddedToken(r, (*list)[i], path));
    if (auto [it, inserted] = by_content.emplace(token.content, i); !inserted) {
      return r.Error(
          path + ".content",
          absl::StrCat("'", token.content, "' duplicates added_tokens[", it->second, "]"));
    }
    auto in_vocab = spec->vocab.find(token.content);
    const int64_t expected = in_vocab != spec->vocab.end() ? in_vocab->second
                             : max_added < 0               ? model_size
                             : max_added >= model_size     ? max_added + 1
                                                           : model_size;
    if (token.id != expected) {
      return r.Error(path + ".id", absl::StrCat("id ", token.id, " for '", token.content,
                                                "', but tokenizers assigns it id ", expected));
    }
    max_added = std::max<int64_t>(max_added, token.id);
    spec->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

std::string Canonical(const TokenizerSpec& spec) {
  std::vector<const std::string*> by_id;
  for (const auto& [token, id] : spec.vocab) {
    if (by_id.size() <= static_cast<size_t>(id)) by_id.resize(static_cast<size_t>(id) + 1);
    by_id[id] = &token;
  }
  json vocab = json::array();
  for (const std::string* token : by_id) vocab.push_back(token ? json(*token) : json());
  json merges = json::array();
  for (const auto& [left, right] : spec.merges) merges.push_back({left, right});
  json added = json::array();
  for (const AddedToken& t : spec.added_tokens) {
    added.push_back({t.id, t.content, t.special, t.lstrip, t.rstrip, t.single_word, t.normalized});
  }
  json canonical = {
      {"format", "dflash-tokenizer-1"},
      {"nfc", spec.nfc},
      {"splits", spec.pre_tokenizer.split_patterns},
      {"add_prefix_space", spec.pre_tokenizer.add_prefix_space},
      {"use_regex", spec.pre_tokenizer.use_regex},
      {"vocab", std::move(vocab)},
      {"merges", std::move(merges)},
      {"ignore_merges", spec.ignore_merges},
      {"added_tokens", std::move(added)},
  };
  // Added only when set: fingerprints of files without these options stay what they were.
  if (spec.unk_id >= 0) canonical["unk_id"] = spec.unk_id;
  if (spec.unk_id >= 0 && spec.fuse_unk) canonical["fuse_unk"] = true;
  if (spec.byte_fallback) canonical["byte_fallback"] = true;
  return canonical.dump();
}

}  // namespace

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(std::string_view text, std::string_view source) {
  const Reader r(absl::string_view(source.data(), source.size()));
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return r.Error("(root)", absl::StrCat("malformed JSON: ", e.what()));
  }
  if (!root.is_object()) return r.Error("(root)", "expected an object");
  for (const char* key : {"truncation", "padding"}) {
    if (Reader::Find(root, key) != nullptr) {
      return r.Error(key, "must be null: encode would truncate or pad");
    }
  }
  TokenizerSpec spec;
  RETURN_IF_ERROR(ParseNormalizer(r, root.value("normalizer", json()), "normalizer", &spec.nfc));
  RETURN_IF_ERROR(ParsePreTokenizer(r, root, &spec.pre_tokenizer));
  RETURN_IF_ERROR(ParseDecoder(r, root, &spec.decoder));
  RETURN_IF_ERROR(ParsePostProcessor(r, root.value("post_processor", json()), "post_processor"));
  RETURN_IF_ERROR(ParseModel(r, root, &spec));
  RETURN_IF_ERROR(ParseAddedTokens(r, root, &spec));
  spec.canonical = Canonical(spec);
  return spec;
}

}  // namespace dflash::tokenizer

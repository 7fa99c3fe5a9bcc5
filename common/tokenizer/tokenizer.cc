#include "common/tokenizer/tokenizer.h"

#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/unicode.h"

namespace dflash::tokenizer {
namespace {

enum class Kind : uint8_t { kNone, kModel, kAdded, kSpecial };

absl::StatusOr<std::string> Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    return DFLASH_INTERNAL_ERROR("EVP_Digest(SHA-256) failed");
  }
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

// What Decode emits for a token, as HF's ByteLevel decoder does: the bytes its byte-level code
// points stand for, or the token's own UTF-8 when any code point is outside the alphabet.
std::string DecodedBytes(const std::string& token) {
  std::optional<std::string> bytes = byte_level::ToBytes(token);
  return bytes ? *std::move(bytes) : token;
}

BpeTables MakeBpeTables(const TokenizerSpec& spec, size_t id_count) {
  BpeTables t;
  for (int b = 0; b < 256; ++b) {
    const std::string& symbol = byte_level::ByteStrings()[b];
    auto it = spec.vocab.find(symbol);
    t.byte_ids[b] = it == spec.vocab.end() ? -1 : it->second;
    if (it != spec.vocab.end()) continue;
    t.any_missing = true;
    if (!spec.byte_fallback) continue;
    // HF falls back to "<0xXX>" of the symbol's UTF-8 bytes (BPE sees the byte-level string).
    std::vector<int32_t> ids;
    for (const char c : symbol) {
      auto f = spec.vocab.find(absl::StrFormat("<0x%02X>", static_cast<unsigned char>(c)));
      if (f == spec.vocab.end()) break;
      ids.push_back(f->second);
    }
    if (ids.size() == symbol.size()) t.fallback[b] = std::move(ids);
  }
  t.unk_id = spec.unk_id;
  t.fuse_unk = spec.fuse_unk;
  t.merges.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto [left, right] = spec.merges[rank];
    t.merges.emplace(
        (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right),
        (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(spec.merge_results[rank]));
  }
  t.byte_length.assign(id_count, 0);
  for (const auto& [token, id] : spec.vocab) {
    std::optional<std::string> bytes = byte_level::ToBytes(token);
    if (!bytes) continue;  // BPE over bytes can never produce it
    t.byte_length[static_cast<size_t>(id)] = static_cast<uint32_t>(bytes->size());
    if (spec.ignore_merges) t.vocab_by_bytes.emplace(*std::move(bytes), id);
  }
  t.ignore_merges = spec.ignore_merges;
  return t;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  bool nfc = false;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> bpe;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<AddedTokenMatcher> raw_matcher;         // tokens with normalized: false
  std::unique_ptr<AddedTokenMatcher> normalized_matcher;  // tokens with normalized: true
  std::vector<AddedToken> added_tokens;
  std::vector<std::string> id_to_token;  // "" where kind is kNone
  std::vector<Kind> kind;                // by id
  std::vector<std::string> decoded;      // by id, see DecodedBytes
  absl::flat_hash_map<std::string, int32_t> token_to_id;
  std::string fingerprint;

  std::string NormalizePiece(std::string_view piece) const {
    return nfc ? unicode::Nfc(piece) : std::string(piece);
  }
  absl::Status EncodeNormalized(std::string_view text, uint32_t base, Encoding* out) const;
  void BuildIdTables(const TokenizerSpec& spec);
};

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return FromJson(text.str(), path.string());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json,
                                                               std::string_view source) {
  ASSIGN_OR_RETURN(TokenizerSpec spec, ParseTokenizerJson(json, source));
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source);
  impl->nfc = spec.nfc;
  auto pre = PreTokenizer::Create(spec.pre_tokenizer);
  if (!pre.ok()) return Annotate(pre.status(), impl->source);
  impl->pre_tokenizer = *std::move(pre);
  impl->BuildIdTables(spec);
  impl->bpe = std::make_unique<Bpe>(MakeBpeTables(spec, impl->id_to_token.size()));
  auto decoder = Decoder::Create(std::move(spec.decoder));
  if (!decoder.ok()) return Annotate(decoder.status(), impl->source);
  impl->decoder = *std::move(decoder);
  std::vector<AddedTokenMatcher::Pattern> raw, normalized;
  for (const AddedToken& t : spec.added_tokens) {
    AddedTokenMatcher::Pattern p{t.content, t.id, t.single_word, t.lstrip, t.rstrip};
    // HF matches normalized tokens by their normalized content, in normalized text.
    if (t.normalized) p.text = impl->NormalizePiece(t.content);
    (t.normalized ? normalized : raw).push_back(std::move(p));
  }
  impl->raw_matcher = std::make_unique<AddedTokenMatcher>(std::move(raw));
  impl->normalized_matcher = std::make_unique<AddedTokenMatcher>(std::move(normalized));
  impl->added_tokens = std::move(spec.added_tokens);
  ASSIGN_OR_RETURN(impl->fingerprint, Sha256Hex(spec.canonical));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

void Tokenizer::Impl::BuildIdTables(const TokenizerSpec& spec) {
  Impl* impl = this;
  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : spec.added_tokens) max_id = std::max(max_id, t.id);
  const size_t n = static_cast<size_t>(max_id) + 1;
  impl->id_to_token.assign(n, std::string());
  impl->kind.assign(n, Kind::kNone);
  impl->decoded.assign(n, std::string());
  impl->token_to_id = spec.vocab;
  for (const auto& [token, id] : spec.vocab) {
    impl->id_to_token[id] = token;
    impl->kind[id] = Kind::kModel;
  }
  for (const AddedToken& t : spec.added_tokens) {
    impl->id_to_token[t.id] = t.content;
    impl->kind[t.id] = t.special ? Kind::kSpecial : Kind::kAdded;
    impl->token_to_id[t.content] = t.id;
  }
  for (size_t id = 0; id < n; ++id) {
    if (impl->kind[id] != Kind::kNone) impl->decoded[id] = DecodedBytes(impl->id_to_token[id]);
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::Status Tokenizer::Impl::EncodeNormalized(std::string_view text, uint32_t base,
                                               Encoding* out) const {
  thread_local std::vector<uint32_t> starts;  // byte positions in `bytes`
  auto emit = [&](std::string_view bytes, uint32_t offset, uint32_t phantom) {
    starts.clear();
    bpe->Encode(bytes, &out->ids, &starts);
    for (const uint32_t local : starts) {
      out->offsets.push_back(offset + (local > phantom ? local - phantom : 0));
    }
  };
  if (normalized_matcher->empty()) return pre_tokenizer->Run(text, base, emit);
  std::vector<TextSplit> splits;
  normalized_matcher->Split(text, &splits);
  for (const TextSplit& s : splits) {
    if (s.id >= 0) {
      out->ids.push_back(s.id);
      out->offsets.push_back(base + s.start);
    } else {
      RETURN_IF_ERROR(
          pre_tokenizer->Run(text.substr(s.start, s.end - s.start), base + s.start, emit));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Encoding> Tokenizer::Encode(std::string_view text) const {
  return Encode(text, EncodeOptions{});
}

absl::StatusOr<Encoding> Tokenizer::Encode(std::string_view text,
                                           const EncodeOptions& options) const {
  if (text.size() > (uint32_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("text of ", text.size(), " bytes is over 1 GiB"));
  }
  if (const size_t bad = unicode::FindInvalidUtf8(text); bad != unicode::kValid) {
    return absl::InvalidArgumentError(
        absl::StrFormat("text is not valid UTF-8: byte 0x%02X at byte offset %d does not start a "
                        "well-formed sequence",
                        static_cast<unsigned char>(text[bad]), bad));
  }
  Encoding out;
  out.ids.reserve(text.size() / 3 + 4);
  out.offsets.reserve(text.size() / 3 + 4);
  std::vector<TextSplit> splits;
  if (impl_->raw_matcher->empty()) {
    if (!text.empty()) splits.push_back({0, static_cast<uint32_t>(text.size()), -1});
  } else {
    impl_->raw_matcher->Split(text, &splits);
  }
  uint32_t pos = 0;  // in the normalized text (see Normalize)
  for (const TextSplit& s : splits) {
    const std::string_view piece = text.substr(s.start, s.end - s.start);
    if (s.id >= 0) {
      out.ids.push_back(s.id);
      out.offsets.push_back(pos);
      pos += static_cast<uint32_t>(piece.size());
    } else if (impl_->nfc && !options.text_is_normalized) {
      const std::string normalized = unicode::Nfc(piece);
      RETURN_IF_ERROR(impl_->EncodeNormalized(normalized, pos, &out));
      pos += static_cast<uint32_t>(normalized.size());
    } else {
      RETURN_IF_ERROR(impl_->EncodeNormalized(piece, pos, &out));
      pos += static_cast<uint32_t>(piece.size());
    }
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeIds(std::string_view text) const {
  ASSIGN_OR_RETURN(Encoding e, Encode(text));
  return std::move(e.ids);
}

absl::StatusOr<std::string> Tokenizer::Normalize(std::string_view text) const {
  if (const size_t bad = unicode::FindInvalidUtf8(text); bad != unicode::kValid) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 at byte offset ", bad));
  }
  if (!impl_->nfc) return std::string(text);
  // As Encode sees it: added tokens that are matched before normalization stay as they are.
  std::vector<TextSplit> splits;
  impl_->raw_matcher->Split(text, &splits);
  std::string out;
  for (const TextSplit& s : splits) {
    const std::string_view piece = text.substr(s.start, s.end - s.start);
    out += s.id >= 0 ? std::string(piece) : unicode::Nfc(piece);
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= impl_->kind.size() || impl_->kind[id] == Kind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ids[", i, "] = ", id, " is not a token id (vocab_size ", impl_->kind.size(), ")"));
    }
  }
  if (!impl_->decoder->IsPlainByteLevel()) {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const int32_t id : ids) {
      if (skip_special_tokens && impl_->kind[id] == Kind::kSpecial) continue;
      tokens.push_back(impl_->id_to_token[id]);
    }
    return impl_->decoder->Decode(std::move(tokens));
  }
  for (const int32_t id : ids) {
    if (skip_special_tokens && impl_->kind[id] == Kind::kSpecial) continue;
    bytes += impl_->decoded[id];
  }
  return unicode::Utf8Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = impl_->token_to_id.find(absl::string_view(token.data(), token.size()));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->kind.size() || impl_->kind[id] == Kind::kNone) {
    return std::nullopt;
  }
  return impl_->id_to_token[id];
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->kind.size()); }

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added_tokens; }

const std::string& Tokenizer::fingerprint() const { return impl_->fingerprint; }

}  // namespace dflash::tokenizer

// A Hugging Face `tokenizer.json` of the byte-level BPE family (GPT-2 style: Qwen2, Qwen3,
// Qwen3.5/3.6, Llama-3, SmolLM2 in its original and GGUF-converted forms), reimplemented in C++ and
// checked token for token against the HF `tokenizers` package (tests/tokenizer).
//
// Pipeline, as HF runs it for these files:
//   1. added tokens (special or not) are found in the raw text first, honouring their lstrip,
//      rstrip, single_word and normalized flags; the pieces between them go through steps 2-5;
//   2. normalizer (NFC, a Sequence of supported normalizers, or none);
//   3. pre-tokenizer: Split by the file's regexes or literal strings and Digits (PCRE2 with
//      Unicode properties), then ByteLevel (bytes mapped to the printable GPT-2 alphabet; its own
//      regex when use_regex is true);
//   4. BPE: merges applied by rank inside each pre-token; a byte whose symbol the vocabulary lacks
//      becomes byte-fallback tokens, the unk token or nothing, as in HF (bpe.h);
//   5. ids from the vocabulary.
// Decode runs the file's decoder chain (decoder.h) over the tokens' strings; special tokens are
// their content unless skipped. Post-processors add nothing (see Encode).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dflash::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// One encoded text: ids and, for each id, the byte offset where the token starts in the text that
// was passed to Encode (after normalization when Encode normalizes; see Encode). offsets[i] <=
// offsets[i+1]; a token produced by an added token starts at the added token's first byte.
// Precisely, offsets index Normalize(text): the text with each stretch between added tokens that
// are matched before normalization (normalized: false) normalized on its own. Tokens are byte
// spans: a token that starts inside a multi-byte character gets that byte's offset; an added token
// with lstrip starts where the whitespace it absorbed starts; ByteLevel's prefix space, which is
// not in the text, belongs to the token at the start of its pre-token. A byte that BPE drops (its
// symbol is missing from the vocabulary and there is no unk token) starts no token.
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<uint32_t> offsets;
};

class Tokenizer {
 public:
  // Parses and validates `tokenizer.json`. Errors name the file and the JSON field, e.g.
  // "tokenizer.json: model.merges[17]: token 'Ġx' is not in the vocabulary". Unsupported
  // components (WordPiece, Unigram, a normalizer or pre-tokenizer we do not implement) are refused
  // by name rather than silently approximated.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::filesystem::path& path);
  // Same, from the file's contents; `source` names it in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json,
                                                             std::string_view source);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes UTF-8 text the way `tokenizers.Tokenizer.encode(text, add_special_tokens=False)` does
  // (added tokens inside the text are recognised). Invalid UTF-8 is an InvalidArgument error naming
  // the byte offset. Thread-safe: many threads may encode with one Tokenizer at once.
  absl::StatusOr<Encoding> Encode(std::string_view text) const;
  struct EncodeOptions {
    // The caller passes text that is already Normalize()d (a chat template concatenates normalized
    // pieces): the normalizer is not run again. Normalization is idempotent, so ids are unchanged;
    // it saves the normalizer's pass (about a quarter of prepare's time with NFC on mixed text).
    bool text_is_normalized = false;
  };
  absl::StatusOr<Encoding> Encode(std::string_view text, const EncodeOptions& options) const;
  // Shorthand for Encode(text)->ids.
  absl::StatusOr<std::vector<int32_t>> EncodeIds(std::string_view text) const;

  // The file's normalizer applied to `text` (identity when it has none). Callers that need byte
  // offsets into pieces they concatenate (chat templates) normalize each piece first; Encode of an
  // already-normalized text leaves it unchanged because the supported normalizers are idempotent.
  absl::StatusOr<std::string> Normalize(std::string_view text) const;

  // Inverse of Encode up to normalization. Ids out of range are an InvalidArgument error. Bytes
  // that do not form valid UTF-8 decode to U+FFFD, as HF does.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // Vocabulary lookups (added tokens included).
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // One past the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;

  // Identifies the tokenizer by what it does, not by how its file is formatted: a SHA-256 (hex)
  // over a canonical serialization of normalizer, pre-tokenizer, vocabulary, merges, the BPE
  // options that change ids (unk_token, fuse_unk, byte_fallback) and added tokens. Two files that
  // tokenize identically but differ in whitespace or key order share it.
  const std::string& fingerprint() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash::tokenizer

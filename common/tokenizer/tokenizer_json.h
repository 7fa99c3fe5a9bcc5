// Reading and validating tokenizer.json into plain tables. Everything a later stage relies on is
// checked here, and every error names the source and the JSON field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace dflash::tokenizer {

// Ids above this are refused: the id tables are dense.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

struct TokenizerSpec {
  bool nfc = false;  // the normalizer (a Sequence of NFCs collapses to one: NFC is idempotent)
  PreTokenizerConfig pre_tokenizer;
  absl::flat_hash_map<std::string, int32_t> vocab;  // model.vocab
  std::vector<std::pair<int32_t, int32_t>> merges;  // model.merges by rank, as vocab ids
  std::vector<int32_t> merge_results;               // id of each merge's concatenation
  bool ignore_merges = false;
  int32_t unk_id = -1;  // model.unk_token's id; -1 when null
  bool fuse_unk = false;
  bool byte_fallback = false;
  std::vector<DecoderStep> decoder;      // Sequences flattened
  std::vector<AddedToken> added_tokens;  // in file order, ids checked against HF's assignment
  // What the tokenizer does, serialized canonically (input of fingerprint()).
  std::string canonical;
};

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(std::string_view json, std::string_view source);

}  // namespace dflash::tokenizer

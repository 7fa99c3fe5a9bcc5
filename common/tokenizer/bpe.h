// The BPE model over bytes: a pre-token's bytes start as one symbol each (the byte-level alphabet's
// ids) and adjacent pairs are merged lowest rank first, leftmost first among equal ranks, until no
// pair has a merge; exactly HF's `Word::merge_all` without dropout.
//
// A byte whose symbol the vocabulary lacks becomes what HF's `BPE::merge_word` makes of it: the
// byte-fallback tokens "<0xXX>" of the symbol's UTF-8 bytes (byte_fallback, when all are in the
// vocabulary), else the unk token (consecutive ones fused into one with fuse_unk), else nothing.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace dflash::tokenizer {

struct BpeTables {
  std::array<int32_t, 256> byte_ids{};             // id of each byte's symbol; -1 if missing
  std::array<std::vector<int32_t>, 256> fallback;  // byte-fallback ids of a missing byte's symbol
  int32_t unk_id = -1;                             // -1: no unk token
  bool fuse_unk = false;
  bool any_missing = false;                        // some byte_ids are -1
  absl::flat_hash_map<uint64_t, uint64_t> merges;  // (left << 32 | right) -> (rank << 32 | id)
  absl::flat_hash_map<std::string, int32_t> vocab_by_bytes;  // for ignore_merges
  std::vector<uint32_t> byte_length;                         // per id; 0 if not byte-level
  bool ignore_merges = false;
};

class Bpe {
 public:
  explicit Bpe(BpeTables tables);
  ~Bpe();
  Bpe(const Bpe&) = delete;
  Bpe& operator=(const Bpe&) = delete;

  // Appends the ids of one pre-token (raw bytes, not the byte-level string) and, for each id, the
  // position in `bytes` of its first byte. Thread-safe.
  void Encode(std::string_view bytes, std::vector<int32_t>* ids,
              std::vector<uint32_t>* starts) const;

 private:
  class Cache;
  void EncodeIds(std::string_view bytes, std::vector<int32_t>* ids) const;
  // The path for a pre-token with a byte whose symbol is missing (rare; not cached).
  void EncodeWithMissing(std::string_view bytes, std::vector<int32_t>* ids,
                         std::vector<uint32_t>* starts) const;
  void Merge(std::string_view bytes, std::vector<int32_t>* ids) const;
  void MergeShort(std::string_view bytes, std::vector<int32_t>* ids) const;
  void MergeLong(std::string_view bytes, std::vector<int32_t>* ids) const;
  // HF's heap merge over initial symbols; appends the surviving ids and, when `firsts` is set, the
  // index in `init` of each survivor's first symbol.
  void MergeSymbols(const int32_t* init, int32_t n, std::vector<int32_t>* ids,
                    std::vector<uint32_t>* firsts) const;
  // (rank << 32 | new id) of the merge of left and right, or UINT64_MAX.
  uint64_t Lookup(int32_t left, int32_t right) const;

  BpeTables tables_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace dflash::tokenizer

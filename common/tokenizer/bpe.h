// The BPE model over bytes: a pre-token's bytes start as one symbol each (the byte-level alphabet's
// ids) and adjacent pairs are merged lowest rank first, leftmost first among equal ranks, until no
// pair has a merge; exactly HF's `Word::merge_all` without dropout.
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
  std::array<int32_t, 256> byte_ids{};             // id of each byte's symbol
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

  // Appends the ids of one pre-token (raw bytes, not the byte-level string). Thread-safe.
  void Encode(std::string_view bytes, std::vector<int32_t>* ids) const;

  // Number of raw bytes id stands for (ids that come out of Encode are all > 0).
  uint32_t ByteLength(int32_t id) const { return tables_.byte_length[static_cast<size_t>(id)]; }

 private:
  class Cache;
  void Merge(std::string_view bytes, std::vector<int32_t>* ids) const;
  void MergeShort(std::string_view bytes, std::vector<int32_t>* ids) const;
  void MergeLong(std::string_view bytes, std::vector<int32_t>* ids) const;
  // (rank << 32 | new id) of the merge of left and right, or UINT64_MAX.
  uint64_t Lookup(int32_t left, int32_t right) const;

  BpeTables tables_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace dflash::tokenizer

#include "common/tokenizer/bpe.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <queue>

#include "absl/hash/hash.h"

namespace dflash::tokenizer {
namespace {

constexpr uint64_t kNoMerge = std::numeric_limits<uint64_t>::max();
// Quadratic scanning beats a heap on the short pre-tokens that make up nearly all text.
constexpr size_t kShortWord = 48;

}  // namespace

// A bounded cache of pre-token -> ids, safe for concurrent Encode calls: 64 shards picked by hash,
// each behind its own mutex, each cleared when it reaches its bound (words repeat heavily, so a
// cleared shard refills with the frequent ones within a few thousand words).
class Bpe::Cache {
 public:
  static constexpr size_t kShards = 64;
  static constexpr size_t kPerShard = 2048;
  static constexpr size_t kMaxKey = 64;  // longer pre-tokens are rare and rarely repeat

  bool Find(absl::string_view key, size_t hash, std::vector<int32_t>* ids) {
    Shard& s = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(key);
    if (it == s.map.end()) return false;
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return true;
  }

  void Insert(absl::string_view key, size_t hash, const int32_t* ids, size_t n) {
    Shard& s = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kPerShard) s.map.clear();
    s.map.try_emplace(key, ids, ids + n);
  }

 private:
  struct alignas(64) Shard {
    std::mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> map;
  };
  std::array<Shard, kShards> shards_;
};

Bpe::Bpe(BpeTables tables) : tables_(std::move(tables)), cache_(std::make_unique<Cache>()) {}

Bpe::~Bpe() = default;

uint64_t Bpe::Lookup(int32_t left, int32_t right) const {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  auto it = tables_.merges.find(key);
  return it == tables_.merges.end() ? kNoMerge : it->second;
}

void Bpe::Encode(std::string_view bytes, std::vector<int32_t>* ids,
                 std::vector<uint32_t>* starts) const {
  if (bytes.empty()) return;
  if (tables_.any_missing) {
    for (const char c : bytes) {
      if (tables_.byte_ids[static_cast<unsigned char>(c)] < 0) {
        EncodeWithMissing(bytes, ids, starts);
        return;
      }
    }
  }
  const size_t first = ids->size();
  EncodeIds(bytes, ids);
  uint32_t local = 0;
  for (size_t i = first; i < ids->size(); ++i) {
    starts->push_back(local);
    local += tables_.byte_length[static_cast<size_t>((*ids)[i])];
  }
}

void Bpe::EncodeIds(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (bytes.size() == 1) {
    ids->push_back(tables_.byte_ids[static_cast<unsigned char>(bytes[0])]);
    return;
  }
  if (tables_.ignore_merges) {
    // Llama-3: a pre-token that is itself in the vocabulary is emitted whole.
    auto it = tables_.vocab_by_bytes.find(absl::string_view(bytes.data(), bytes.size()));
    if (it != tables_.vocab_by_bytes.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (bytes.size() > Cache::kMaxKey) {
    Merge(bytes, ids);
    return;
  }
  const absl::string_view key(bytes.data(), bytes.size());
  const size_t hash = absl::Hash<absl::string_view>()(key);
  if (cache_->Find(key, hash, ids)) return;
  const size_t before = ids->size();
  Merge(bytes, ids);
  cache_->Insert(key, hash, ids->data() + before, ids->size() - before);
}

void Bpe::EncodeWithMissing(std::string_view bytes, std::vector<int32_t>* ids,
                            std::vector<uint32_t>* starts) const {
  if (tables_.ignore_merges) {
    auto it = tables_.vocab_by_bytes.find(absl::string_view(bytes.data(), bytes.size()));
    if (it != tables_.vocab_by_bytes.end()) {
      ids->push_back(it->second);
      starts->push_back(0);
      return;
    }
  }
  // The initial symbols as HF's merge_word builds them. Like HF's Word, each symbol's start is the
  // sum of the lengths before it (a byte each, the fused bytes for an unk, 0, ..., 0, 1 for the
  // fallback tokens of one byte), so starts never decrease even where HF emits a pending unk after
  // fallback tokens of a later byte; a dropped byte only moves the next start on.
  std::vector<int32_t> init;
  std::vector<uint32_t> init_start;
  init.reserve(bytes.size());
  init_start.reserve(bytes.size());
  uint32_t pos = 0;
  uint32_t unk_len = 0;  // > 0: an unk is pending
  auto add = [&](int32_t id, uint32_t len) {
    init.push_back(id);
    init_start.push_back(pos);
    pos += len;
  };
  auto flush_unk = [&] {
    if (unk_len > 0) add(tables_.unk_id, unk_len);
    unk_len = 0;
  };
  for (const char c : bytes) {
    const unsigned char b = static_cast<unsigned char>(c);
    if (tables_.byte_ids[b] >= 0) {
      flush_unk();
      add(tables_.byte_ids[b], 1);
    } else if (!tables_.fallback[b].empty()) {
      // HF adds these without emitting a pending unk first (it comes later, after them).
      const std::vector<int32_t>& ids = tables_.fallback[b];
      for (size_t k = 0; k < ids.size(); ++k) add(ids[k], k + 1 == ids.size() ? 1 : 0);
    } else if (tables_.unk_id >= 0) {
      if (!tables_.fuse_unk) flush_unk();
      ++unk_len;
    } else {
      ++pos;  // dropped
    }
  }
  flush_unk();
  if (init.empty()) return;
  std::vector<uint32_t> firsts;
  MergeSymbols(init.data(), static_cast<int32_t>(init.size()), ids, &firsts);
  for (const uint32_t f : firsts) starts->push_back(init_start[f]);
}

void Bpe::Merge(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (bytes.size() <= kShortWord) {
    MergeShort(bytes, ids);
  } else {
    MergeLong(bytes, ids);
  }
}

void Bpe::MergeShort(std::string_view bytes, std::vector<int32_t>* ids) const {
  int32_t sym[kShortWord];
  uint64_t pair[kShortWord];  // pair[i]: merge of sym[i] and sym[i + 1]
  size_t n = bytes.size();
  for (size_t i = 0; i < n; ++i) sym[i] = tables_.byte_ids[static_cast<unsigned char>(bytes[i])];
  for (size_t i = 0; i + 1 < n; ++i) pair[i] = Lookup(sym[i], sym[i + 1]);
  while (n > 1) {
    // Packed (rank << 32 | id): the smallest value is the lowest rank; strict < keeps the leftmost.
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (pair[i] < pair[best]) best = i;
    }
    if (pair[best] == kNoMerge) break;
    sym[best] = static_cast<int32_t>(pair[best] & 0xFFFFFFFFu);
    std::copy(sym + best + 2, sym + n, sym + best + 1);
    std::copy(pair + best + 1, pair + n - 1, pair + best);
    --n;
    if (best > 0) pair[best - 1] = Lookup(sym[best - 1], sym[best]);
    if (best + 1 < n) pair[best] = Lookup(sym[best], sym[best + 1]);
  }
  ids->insert(ids->end(), sym, sym + n);
}

void Bpe::MergeLong(std::string_view bytes, std::vector<int32_t>* ids) const {
  thread_local std::vector<int32_t> init;
  init.resize(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    init[i] = tables_.byte_ids[static_cast<unsigned char>(bytes[i])];
  }
  MergeSymbols(init.data(), static_cast<int32_t>(init.size()), ids, nullptr);
}

void Bpe::MergeSymbols(const int32_t* init, int32_t n, std::vector<int32_t>* ids,
                       std::vector<uint32_t>* firsts) const {
  struct Symbol {
    int32_t id, prev, next;
    bool live;
  };
  // (rank << 32 | position), smallest first: lowest rank, then leftmost, as HF's heap orders them.
  using Entry = std::pair<uint64_t, int32_t>;  // (key, id the merge produces)
  thread_local std::vector<Symbol> syms;
  syms.resize(static_cast<size_t>(n));
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t pos) {
    const int32_t next = syms[pos].next;
    if (next < 0) return;
    const uint64_t m = Lookup(syms[pos].id, syms[next].id);
    if (m != kNoMerge) {
      heap.emplace((m & 0xFFFFFFFF00000000ULL) | static_cast<uint32_t>(pos),
                   static_cast<int32_t>(m & 0xFFFFFFFFu));
    }
  };
  for (int32_t i = 0; i < n; ++i) syms[i] = {init[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [key, new_id] = heap.top();
    heap.pop();
    const int32_t pos = static_cast<int32_t>(key & 0xFFFFFFFFu);
    Symbol& s = syms[pos];
    if (!s.live || s.next < 0) continue;
    // Stale entry: the pair at pos no longer makes new_id (HF's test, quirks included).
    const uint64_t m = Lookup(s.id, syms[s.next].id);
    if (m == kNoMerge || static_cast<int32_t>(m & 0xFFFFFFFFu) != new_id) continue;
    Symbol& right = syms[s.next];
    right.live = false;
    s.id = new_id;
    s.next = right.next;
    if (s.next >= 0) syms[s.next].prev = pos;
    if (s.prev >= 0) push(s.prev);
    push(pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    ids->push_back(syms[i].id);
    if (firsts != nullptr) firsts->push_back(static_cast<uint32_t>(i));
  }
}

}  // namespace dflash::tokenizer

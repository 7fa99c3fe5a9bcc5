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

void Bpe::Encode(std::string_view bytes, std::vector<int32_t>* ids) const {
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
  struct Symbol {
    int32_t id, prev, next;
    bool live;
  };
  // (rank << 32 | position), smallest first: lowest rank, then leftmost, as HF's heap orders them.
  using Entry = std::pair<uint64_t, int32_t>;  // (key, id the merge produces)
  thread_local std::vector<Symbol> syms;
  const int32_t n = static_cast<int32_t>(bytes.size());
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
  for (int32_t i = 0; i < n; ++i) {
    syms[i] = {tables_.byte_ids[static_cast<unsigned char>(bytes[i])], i - 1,
               i + 1 < n ? i + 1 : -1, true};
  }
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [key, new_id] = heap.top();
    heap.pop();
    const int32_t pos = static_cast<int32_t>(key & 0xFFFFFFFFu);
    Symbol& s = syms[pos];
    if (!s.live || s.next < 0) continue;
    // Stale entry: the pair at pos changed since it was pushed (a changed pair always yields a
    // longer, hence different, token).
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
  for (int32_t i = 0; i >= 0; i = syms[i].next) ids->push_back(syms[i].id);
}

}  // namespace dflash::tokenizer

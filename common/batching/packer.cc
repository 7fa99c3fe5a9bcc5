#include "common/batching/packer.h"

#include <algorithm>
#include <numeric>

namespace dflash::batching {

CapacityIndex::CapacityIndex(int64_t budget)
    : buckets_(budget + 1), words_((budget + 64) / 64, 0), summary_((words_.size() + 63) / 64, 0) {}

void CapacityIndex::SetBit(int64_t capacity) {
  const int64_t w = capacity >> 6;
  words_[w] |= uint64_t{1} << (capacity & 63);
  summary_[w >> 6] |= uint64_t{1} << (w & 63);
}

void CapacityIndex::ClearBit(int64_t capacity) {
  const int64_t w = capacity >> 6;
  words_[w] &= ~(uint64_t{1} << (capacity & 63));
  if (words_[w] == 0) summary_[w >> 6] &= ~(uint64_t{1} << (w & 63));
}

int64_t CapacityIndex::FindAtLeast(int64_t length) const {
  if (length >= static_cast<int64_t>(buckets_.size())) return -1;
  int64_t w = length >> 6;
  const uint64_t here = words_[w] & (~uint64_t{0} << (length & 63));
  if (here != 0) return (w << 6) + __builtin_ctzll(here);
  // Next non-empty word after w, found through the summary bits.
  ++w;
  int64_t s = w >> 6;
  if (s >= static_cast<int64_t>(summary_.size())) return -1;
  uint64_t bits = (w & 63) == 0 ? summary_[s] : summary_[s] & (~uint64_t{0} << (w & 63));
  while (bits == 0) {
    if (++s >= static_cast<int64_t>(summary_.size())) return -1;
    bits = summary_[s];
  }
  const int64_t word = (s << 6) + __builtin_ctzll(bits);
  return (word << 6) + __builtin_ctzll(words_[word]);
}

void CapacityIndex::Add(int64_t capacity, int32_t bin) {
  std::vector<int32_t>& bucket = buckets_[capacity];
  if (bucket.empty()) {
    SetBit(capacity);
    used_.push_back(capacity);
  }
  bucket.push_back(bin);
}

int32_t CapacityIndex::Pop(int64_t capacity) {
  std::vector<int32_t>& bucket = buckets_[capacity];
  const int32_t bin = bucket.back();
  bucket.pop_back();
  if (bucket.empty()) ClearBit(capacity);
  return bin;
}

void CapacityIndex::Clear() {
  for (int64_t c : used_) {
    if (!buckets_[c].empty()) {
      buckets_[c].clear();
      ClearBit(c);
    }
  }
  used_.clear();
}

int32_t PackBestFitDecreasing(absl::Span<const int32_t> lengths, int64_t budget,
                              CapacityIndex* index, std::vector<int32_t>* bin_of) {
  const int32_t n = static_cast<int32_t>(lengths.size());
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // A strict total order (length desc, index asc) makes the result independent of the sort
  // algorithm's stability, so every standard library gives the same bins.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return lengths[a] != lengths[b] ? lengths[a] > lengths[b] : a < b;
  });
  bin_of->assign(n, -1);
  index->Clear();
  int32_t bins = 0;
  for (int32_t item : order) {
    const int64_t length = lengths[item];
    const int64_t capacity = index->FindAtLeast(length);
    int32_t bin;
    int64_t room;
    if (capacity < 0) {
      bin = bins++;
      room = budget - length;
    } else {
      bin = index->Pop(capacity);
      room = capacity - length;
    }
    (*bin_of)[item] = bin;
    // A full bin can take nothing more (every piece has at least one token): keep it out.
    if (room > 0) index->Add(room, bin);
  }
  return bins;
}

}  // namespace dflash::batching

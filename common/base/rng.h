// The deterministic randomness of batching, anchors and built-in data and models: a SplitMix64 generator, Lemire's bounded draw
// and a seed-mixing hash. Written out here instead of taken from <random> because the results of
// std::uniform_int_distribution and std::shuffle are implementation-defined: libstdc++ and libc++
// give different plans for the same seed. Everything below is defined bit for bit (64-bit
// unsigned arithmetic wraps modulo 2^64), so a plan or an anchor set is identical on every machine,
// compiler and standard library, and after a resume. tests/batching/rng_test.cc pins golden values.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace dflash {

// The SplitMix64 output function (Steele, Lea, Flood 2014; constants from Vigna's splitmix64.c):
// a bijection on 64-bit words with full avalanche, used both as the generator's output stage and
// as the mixing step of SeedHash.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Hashes a tuple of integers into a generator seed: h = kTag; for each v: h = Mix64(h ^ Mix64(v +
// golden)). The per-element Mix64 makes (1, 2) and (2, 1) differ; the leading tag separates
// streams that would otherwise share a tuple (the epoch shuffle and the anchor draw, for example).
inline uint64_t SeedHash(uint64_t tag, std::initializer_list<uint64_t> values) {
  uint64_t h = Mix64(tag);
  for (uint64_t v : values) h = Mix64(h ^ Mix64(v + 0x9e3779b97f4a7c15ULL));
  return h;
}

// Stream tags for SeedHash (arbitrary distinct constants; changing one changes every plan).
inline constexpr uint64_t kTagEpochShuffle = 0x45504f4348534846ULL;  // "EPOCHSHF"
inline constexpr uint64_t kTagAnchors = 0x414e43484f525331ULL;       // "ANCHORS1"
inline constexpr uint64_t kTagDataPrint = 0x4441544150524e54ULL;     // "DATAPRNT"

// SplitMix64: state advances by the golden-ratio increment, output is Mix64(state). Period 2^64;
// passes BigCrush. Far more than enough for shuffling a few million indices.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix64(state_);
  }

  // Uniform integer in [0, bound), bound >= 1, without modulo bias: Lemire, "Fast Random Integer
  // Generation in an Interval" (2019). The high word of x * bound is the draw; the low word
  // rejects the few x that would bias it. Uses the GCC/Clang unsigned __int128.
  uint64_t Below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

// Fisher-Yates (Durstenfeld) shuffle driven by SplitMix64::Below: element i swaps with a uniform
// j in [0, i]. Identical permutation for an identical seed on every platform.
template <typename T>
void DeterministicShuffle(T* data, int64_t n, SplitMix64& rng) {
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    if (j != i) {
      T tmp = data[i];
      data[i] = data[j];
      data[j] = tmp;
    }
  }
}

}  // namespace dflash

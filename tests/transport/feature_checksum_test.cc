// The feature checksum's host reference (common/transport/feature_checksum.h): its definition
// computed independently, and the corruptions it must catch.
#include "common/transport/feature_checksum.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace dflash::transport {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The definition, word by word from explicit byte shifts.
FeatureChecksum ByDefinition(const std::vector<uint8_t>& v) {
  FeatureChecksum c;
  for (size_t i = 0; i * 4 < v.size(); ++i) {
    uint64_t w = 0;
    for (size_t b = 0; b < 4 && i * 4 + b < v.size(); ++b) {
      w |= static_cast<uint64_t>(v[i * 4 + b]) << (8 * b);
    }
    c.sum += w;
    c.weighted += (i + 1) * w;
  }
  return c;
}

TEST(FeatureChecksumTest, MatchesItsDefinitionAtEveryTailLength) {
  for (size_t n : {0, 1, 2, 3, 4, 5, 7, 8, 63, 64, 65, 4099}) {
    const std::vector<uint8_t> v = RandomBytes(n, static_cast<uint32_t>(n) + 1);
    const FeatureChecksum got = ChecksumHost(v.data(), v.size());
    EXPECT_EQ(got, ByDefinition(v)) << n << " bytes";
  }
  EXPECT_EQ(ChecksumHost(nullptr, 0), FeatureChecksum{});
}

TEST(FeatureChecksumTest, WrapsModulo2To64) {
  // 100,000 all-ones words: the weighted sum, n (n + 1) / 2 * (2^32 - 1), exceeds 2^64.
  constexpr uint64_t kWords = 100000, kOnes = 0xffffffff;
  const std::vector<uint8_t> v(4 * kWords, 0xff);
  const unsigned __int128 exact = static_cast<unsigned __int128>(kWords * (kWords + 1) / 2) * kOnes;
  ASSERT_GT(exact, static_cast<unsigned __int128>(~uint64_t{0}));
  const FeatureChecksum c = ChecksumHost(v.data(), v.size());
  EXPECT_EQ(c.sum, kWords * kOnes);
  EXPECT_EQ(c.weighted, static_cast<uint64_t>(exact));  // the low 64 bits
}

TEST(FeatureChecksumTest, EverySingleFlippedBitChangesIt) {
  std::vector<uint8_t> v = RandomBytes(37, 7);
  const FeatureChecksum clean = ChecksumHost(v.data(), v.size());
  for (size_t byte = 0; byte < v.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      v[byte] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_NE(ChecksumHost(v.data(), v.size()), clean) << "byte " << byte << " bit " << bit;
      v[byte] ^= static_cast<uint8_t>(1u << bit);
    }
  }
}

TEST(FeatureChecksumTest, ExchangedWordsAndRowsChangeIt) {
  const std::vector<uint8_t> v = RandomBytes(4 * 64, 11);
  const FeatureChecksum clean = ChecksumHost(v.data(), v.size());
  for (size_t i = 0; i < 64; ++i) {
    for (size_t j = i + 1; j < 64; ++j) {
      std::vector<uint8_t> w = v;
      for (int b = 0; b < 4; ++b) std::swap(w[4 * i + b], w[4 * j + b]);
      if (w == v) continue;  // equal words: nothing changed
      EXPECT_NE(ChecksumHost(w.data(), w.size()), clean) << "words " << i << " and " << j;
    }
  }
  // Two rows of 16 words exchanged (a batch's tokens in the wrong order).
  std::vector<uint8_t> w = v;
  std::swap_ranges(w.begin(), w.begin() + 64, w.begin() + 64);
  EXPECT_NE(ChecksumHost(w.data(), w.size()), clean);
}

TEST(FeatureChecksumTest, WithoutCudaTheDeviceSideSaysSo) {
#if !DFLASH_HAVE_CUDA
  EXPECT_EQ(DeviceChecksummer::Create(0).status().code(), absl::StatusCode::kUnimplemented);
#else
  GTEST_SKIP() << "built with CUDA: feature_checksum_gpu_test covers the device side";
#endif
}

}  // namespace
}  // namespace dflash::transport

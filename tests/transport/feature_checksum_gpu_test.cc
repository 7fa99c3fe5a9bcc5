// The feature checksum on the device against its host reference (common/transport/
// feature_checksum.h): every tail length, misaligned starts (the 16-byte, the 4-byte and the byte
// loops of the kernel), a large buffer, and a flipped bit. Skips without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/transport/feature_checksum.h"

namespace dflash::transport {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class FeatureChecksumGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device on this machine";
    absl::StatusOr<std::unique_ptr<DeviceChecksummer>> c = DeviceChecksummer::Create(0);
    ASSERT_TRUE(c.ok()) << c.status();
    checksummer_ = *std::move(c);
  }
  // Copies `v` to the device at `offset` bytes into a fresh buffer and checksums it there.
  FeatureChecksum OnDevice(const std::vector<uint8_t>& v, size_t offset) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, v.size() + offset + 16), cudaSuccess);
    uint8_t* p = static_cast<uint8_t*>(d) + offset;
    if (!v.empty())
      EXPECT_EQ(cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice), cudaSuccess);
    absl::StatusOr<FeatureChecksum> c = checksummer_->Compute(p, v.size());
    EXPECT_TRUE(c.ok()) << c.status();
    cudaFree(d);
    return c.ok() ? *c : FeatureChecksum{~0ull, ~0ull};
  }
  std::unique_ptr<DeviceChecksummer> checksummer_;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_F(FeatureChecksumGpu, EqualsTheHostReferenceAtEveryTailAndAlignment) {
  for (size_t n : {0, 1, 3, 4, 5, 15, 16, 17, 31, 33, 4096, 1000003}) {
    const std::vector<uint8_t> v = RandomBytes(n, static_cast<uint32_t>(n) + 3);
    const FeatureChecksum want = ChecksumHost(v.data(), v.size());
    for (size_t offset : {0, 1, 2, 4, 8, 12}) {
      EXPECT_EQ(OnDevice(v, offset), want) << n << " bytes at offset " << offset;
    }
  }
}

TEST_F(FeatureChecksumGpu, EqualsTheHostReferenceOnAFeatureSizedBuffer) {
  // 8192 tokens x 20480 bf16 features (Qwen3-8B, K = 5) is 335 MB; a quarter of it, plus a tail.
  const std::vector<uint8_t> v = RandomBytes(2048 * 20480 * 2 + 6, 5);
  const FeatureChecksum want = ChecksumHost(v.data(), v.size());
  EXPECT_EQ(OnDevice(v, 0), want);
  std::vector<uint8_t> flipped = v;
  flipped[flipped.size() / 3] ^= 0x10;
  EXPECT_NE(OnDevice(flipped, 0), want);
  EXPECT_EQ(OnDevice(flipped, 0), ChecksumHost(flipped.data(), flipped.size()));
}

}  // namespace
}  // namespace dflash::transport

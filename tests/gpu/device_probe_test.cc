#include <gtest/gtest.h>

#include "common/device/device_probe.h"

namespace dflash::device {
namespace {

TEST(DeviceProbeGpu, ReportsEveryVisibleGpu) {
  const int n = CudaDeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device on this machine";
  for (int gpu = 0; gpu < n; ++gpu) {
    auto d = Probe(gpu);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->kind, "cuda");
    EXPECT_EQ(d->index, gpu);
    EXPECT_FALSE(d->name.empty());
    EXPECT_GT(d->total_bytes, uint64_t{1} << 30);
    EXPECT_LE(d->free_bytes, d->total_bytes);
    EXPECT_GE(d->compute_capability, 70);
  }
  EXPECT_EQ(Probe(n).status().code(), absl::StatusCode::kNotFound);
}

TEST(DeviceProbeGpu, AllocatorStatsAreConsistent) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto s = TorchAllocatorStats(0);
  EXPECT_LE(s.allocated_bytes, s.reserved_bytes);
  EXPECT_LE(s.allocated_bytes, s.peak_allocated_bytes);
}

TEST(DeviceProbeCpu, HostIsAlwaysThere) {
  auto d = Probe(-1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, "cpu");
  EXPECT_GT(d->total_bytes, 0u);
  EXPECT_GT(HostRssBytes(), 0u);
}

}  // namespace
}  // namespace dflash::device

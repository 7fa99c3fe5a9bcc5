// Device probing on the GPU machine; the CPU case runs everywhere. The allocator counters are
// checked against a known allocation made through LibTorch.
#include "common/device/device_probe.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

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

TEST(DeviceProbeGpu, AllocatorStatsFollowATensorsLife) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const AllocatorStats before = TorchAllocatorStats(0);  // allocator may not exist yet: zeros
  constexpr int64_t kFloats = 64 << 20;                  // 256 MiB
  constexpr uint64_t kBytes = kFloats * 4;
  AllocatorStats during;
  {
    at::Tensor t = at::empty({kFloats}, at::TensorOptions().device(at::kCUDA, 0).dtype(at::kFloat));
    during = TorchAllocatorStats(0);
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + kBytes);
    EXPECT_GE(during.reserved_bytes, during.allocated_bytes);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  }
  const AllocatorStats after = TorchAllocatorStats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);  // freed back to the cache
  EXPECT_GE(after.reserved_bytes, kBytes);                   // but still reserved by it
  EXPECT_GE(after.peak_allocated_bytes, during.allocated_bytes);
  auto d = Probe(0);
  ASSERT_TRUE(d.ok());
  EXPECT_GE(d->total_bytes - d->free_bytes, after.reserved_bytes);  // the driver sees the cache
}

TEST(DeviceProbeCpu, HostIsAlwaysThere) {
  auto d = Probe(-1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, "cpu");
  EXPECT_GT(d->total_bytes, 0u);
  EXPECT_GT(HostRssBytes(), 0u);
  const AllocatorStats none = TorchAllocatorStats(-1);
  EXPECT_EQ(none.allocated_bytes + none.reserved_bytes + none.peak_allocated_bytes, 0u);
}

}  // namespace
}  // namespace dflash::device

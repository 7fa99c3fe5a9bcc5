// The worker's per-GPU memory series against LibTorch's caching allocator and the
// driver, for a worker process holding a known allocation: what /metrics serves after a device
// reading equals the allocator's own counters, before, during and after the allocation; total
// and used come from the driver. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "common/device/device_probe.h"
#include "common/metrics/catalogue.h"
#include "services/worker_common/worker_core.h"
#include "tests/common/http_get.h"
#include "tests/worker/cuda_hold.h"

namespace dflash::worker {
namespace {

// The value of `name`'s sample labelled gpu="0" in an exposition text; -1 when absent.
double Sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) == 0 && line.find("gpu=\"0\"") != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

TEST(WorkerMetricsGpu, MemorySeriesMatchLibTorchForAKnownAllocation) {
  if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto metrics = metrics::MetricsServer::Create("worker", "127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  v1::WorkerInfo self;
  self.set_name("w0");
  self.set_role(v1::WORKER_ROLE_DRAFTER);
  self.mutable_device()->set_kind("cuda");
  self.mutable_device()->set_index(0);
  WorkerCore core(
      self, [] { return std::unique_ptr<StepRunner>(); }, metrics->get());
  const auto scrape = [&] { return ::dflash::testing::HttpGet((*metrics)->port(), "/metrics"); };
  const auto check = [&](const char* when) {
    const v1::DeviceInfo d = core.ReadDevice();
    const device::AllocatorStats a = device::TorchAllocatorStats(0);
    const std::string text = scrape();
    SCOPED_TRACE(when);
    EXPECT_EQ(Sample(text, "dflash_worker_gpu_memory_allocated_bytes"),
              static_cast<double>(a.allocated_bytes));
    EXPECT_EQ(Sample(text, "dflash_worker_gpu_memory_reserved_bytes"),
              static_cast<double>(a.reserved_bytes));
    EXPECT_EQ(Sample(text, "dflash_worker_gpu_memory_peak_bytes"),
              static_cast<double>(a.peak_allocated_bytes));
    EXPECT_EQ(Sample(text, "dflash_worker_gpu_memory_total_bytes"),
              static_cast<double>(d.total_bytes()));
    EXPECT_GE(Sample(text, "dflash_worker_gpu_memory_used_bytes"),
              static_cast<double>(a.reserved_bytes));  // the driver sees the allocator's cache
    return a;
  };
  const device::AllocatorStats before = check("before");
  constexpr int64_t kBytes = int64_t{768} << 20;
  std::shared_ptr<void> hold = ::dflash::testing::HoldCudaBytes(0, kBytes);
  const device::AllocatorStats during = check("holding 768 MiB");
  EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + kBytes);
  EXPECT_GE(during.peak_allocated_bytes, before.allocated_bytes + kBytes);
  hold.reset();
  const device::AllocatorStats after = check("after");
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.reserved_bytes, static_cast<uint64_t>(kBytes));  // kept by the cache
}

}  // namespace
}  // namespace dflash::worker

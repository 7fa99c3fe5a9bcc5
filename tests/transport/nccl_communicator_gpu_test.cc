// The nccl communicator (common/transport/nccl_communicator.h) on one GPU. NCCL refuses two ranks
// on one device, so a machine with one GPU checks what one rank can: the bootstrap (unique id ->
// communicator), in-place sums of device and of host (staged) buffers, the deadline when a rank
// never joins (aborted, later calls refused), and Abort() from another thread ending a wait.
// Several ranks are exercised by the multi-GPU runs. Skips without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/transport/nccl_communicator.h"

namespace dflash::transport {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclCommunicatorGpu, OneRankSumsDeviceAndHostBuffersInPlace) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device on this machine";
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = NcclCommunicator::Create(*id, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> host(3000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i) - 7.0f;
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), host.size() * sizeof(float)),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_TRUE((*comm)->AllReduceSum(device, host.size(), ReduceType::kFloat32, true).ok());
  std::vector<float> back(host.size(), -1.0f);
  ASSERT_EQ(cudaMemcpy(back.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);  // one rank: the sum is the input
  cudaFree(device);
  std::vector<double> scalars = {1.5, -2.25, 1e300};
  ASSERT_TRUE(
      (*comm)->AllReduceSum(scalars.data(), scalars.size(), ReduceType::kFloat64, false).ok());
  EXPECT_EQ(scalars, (std::vector<double>{1.5, -2.25, 1e300}));
}

// 16-bit sums (a tensor-parallel target's bf16 / fp16 activations): one rank leaves the bits as
// they are, in the element count given (not bytes).
TEST(NcclCommunicatorGpu, OneRankSums16BitBuffers) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device on this machine";
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = NcclCommunicator::Create(*id, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<uint16_t> host(1001);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(0x3c00 + i);
  for (ReduceType type : {ReduceType::kBFloat16, ReduceType::kFloat16}) {
    uint16_t* device = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), host.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(device, host.data(), host.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_TRUE((*comm)->AllReduceSum(device, host.size(), type, true).ok());
    std::vector<uint16_t> back(host.size(), 0);
    ASSERT_EQ(cudaMemcpy(back.data(), device, host.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(back, host);
    cudaFree(device);
    std::vector<uint16_t> staged = host;  // a host buffer goes through the device
    ASSERT_TRUE((*comm)->AllReduceSum(staged.data(), staged.size(), type, false).ok());
    EXPECT_EQ(staged, host);
  }
}

// The overlapped form (StartAllReduceSum ... WaitStarted): started behind work queued on the
// default stream (a device-side write the host never waited for), finished by WaitStarted.
TEST(NcclCommunicatorGpu, StartedSumsWaitForTheDefaultStreamAndFinishInWaitStarted) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device on this machine";
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = NcclCommunicator::Create(*id, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  constexpr size_t kCount = 1 << 22;
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 1000) * 0.5f;
  float* device[2] = {nullptr, nullptr};
  for (float*& d : device) {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), kCount * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(d, 0, kCount * sizeof(float), nullptr), cudaSuccess);
  }
  // Queued on the default stream, not waited for by the host: the reduction must wait for it.
  ASSERT_EQ(cudaMemcpyAsync(device[0], host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice,
                            nullptr),
            cudaSuccess);
  ASSERT_TRUE((*comm)->StartAllReduceSum(device[0], kCount, ReduceType::kFloat32, true).ok());
  ASSERT_TRUE((*comm)->StartAllReduceSum(device[1], kCount, ReduceType::kFloat32, true).ok());
  ASSERT_TRUE((*comm)->WaitStarted().ok());
  std::vector<float> back(kCount, -1.0f);
  ASSERT_EQ(cudaMemcpy(back.data(), device[0], kCount * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);
  for (float* d : device) cudaFree(d);
}

TEST(NcclCommunicatorGpu, AMissingRankEndsAtTheDeadlineAndAborts) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device on this machine";
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclCommunicator::Options o;
  o.world = 2;  // rank 1 never comes
  o.timeout = absl::Seconds(3);
  auto comm = NcclCommunicator::Create(*id, o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  double x = 1;
  const absl::Time start = absl::Now();
  absl::Status s = (*comm)->AllReduceSum(&x, 1, ReduceType::kFloat64, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ((*comm)->AllReduceSum(&x, 1, ReduceType::kFloat64, false).code(),
            absl::StatusCode::kAborted);
}

TEST(NcclCommunicatorGpu, AbortFromAnotherThreadEndsTheWait) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device on this machine";
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclCommunicator::Options o;
  o.world = 2;
  o.timeout = absl::Minutes(5);
  auto comm = NcclCommunicator::Create(*id, o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::thread aborter([&] {
    absl::SleepFor(absl::Seconds(1));  // let the reduction start waiting for rank 1
    (*comm)->Abort();
  });
  double x = 1;
  const absl::Time start = absl::Now();
  absl::Status s = (*comm)->AllReduceSum(&x, 1, ReduceType::kFloat64, false);
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

TEST(NcclCommunicatorGpu, RefusesBadIdsAndRanks) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device on this machine";
  EXPECT_EQ(NcclCommunicator::Create("short", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  NcclCommunicator::Options o;
  o.world = 2;
  o.rank = 2;
  EXPECT_EQ(NcclCommunicator::Create(std::string(128, 'x'), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dflash::transport

// The nccl feature channel (common/transport/nccl_channel.h). With two GPUs: a sender thread on
// GPU 0 and a receiver thread on GPU 1 move messages of varying size, frames and features arriving
// bit-identical and in order, more messages than slots (the sender runs ahead, bounded); a
// mismatched batch id is refused and aborts the channel. With one GPU (NCCL refuses two ranks on
// one device): descriptors and misuse are refused, a receiver that never comes ends the sender's
// wait at the deadline, and Abort() from another thread ends a wait. Skips without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/transport/nccl_channel.h"

namespace dflash::transport {
namespace {

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

constexpr size_t kMessageBytes = 1000, kFeatureBytes = 1 << 20;

// Message i: (i % 7 + 1) * 100 bytes of frame, i * 4096 + 8 bytes of features, both patterned.
size_t FrameSize(int i) { return static_cast<size_t>(i % 7 + 1) * 100; }
size_t FeatureSize(int i) { return static_cast<size_t>(i) * 4096 + 8; }
uint8_t Byte(int i, size_t k, int salt) { return static_cast<uint8_t>(i * 31 + k * 7 + salt); }

TEST(NcclChannelGpu, RefusesBadDescriptorsAndMisuse) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  EXPECT_EQ(NcclChannel::NewDescriptor(0, 10).status().code(), absl::StatusCode::kInvalidArgument);
  auto d = NcclChannel::NewDescriptor(kMessageBytes, kFeatureBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(NcclChannel::Create("short", {}).status().code(), absl::StatusCode::kInvalidArgument);
  NcclChannel::Options o;
  o.rank = 2;
  EXPECT_EQ(NcclChannel::Create(*d, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  auto sender = NcclChannel::Create(*d, o);
  ASSERT_TRUE(sender.ok()) << sender.status();
  EXPECT_EQ((*sender)->max_message_bytes(), kMessageBytes);
  EXPECT_EQ((*sender)->max_feature_bytes(), kFeatureBytes);
  // Before any transfer: the roles and the order of calls are checked, nothing is joined.
  std::vector<uint8_t> m(10);
  EXPECT_EQ((*sender)->Send(1, m, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*sender)->ReceiveFrame(1).status().code(), absl::StatusCode::kFailedPrecondition);
  o.rank = 1;
  auto receiver = NcclChannel::Create(*d, o);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  EXPECT_EQ((*receiver)->NextFeatureBuffer().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*receiver)->ReceiveFeatures(8).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*receiver)->Release().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NcclChannelGpu, AMissingReceiverEndsAtTheDeadlineAndAborts) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  auto d = NcclChannel::NewDescriptor(kMessageBytes, kFeatureBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  NcclChannel::Options o;
  o.timeout = absl::Seconds(3);
  auto sender = NcclChannel::Create(*d, o);
  ASSERT_TRUE(sender.ok()) << sender.status();
  const absl::Time start = absl::Now();
  auto buffer = (*sender)->NextFeatureBuffer();
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kDeadlineExceeded) << buffer.status();
  EXPECT_GE(absl::Now() - start, absl::Seconds(3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ((*sender)->NextFeatureBuffer().status().code(), absl::StatusCode::kAborted);
}

TEST(NcclChannelGpu, AbortFromAnotherThreadEndsTheWait) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  auto d = NcclChannel::NewDescriptor(kMessageBytes, kFeatureBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  NcclChannel::Options o;
  o.rank = 1;
  o.timeout = absl::Minutes(5);
  auto receiver = NcclChannel::Create(*d, o);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(500));  // lets the wait begin; the test holds either way
    (*receiver)->Abort();
  });
  const absl::Time start = absl::Now();
  EXPECT_EQ((*receiver)->ReceiveFrame(0).status().code(), absl::StatusCode::kAborted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  aborter.join();
}

TEST(NcclChannelGpu, TwoGpusMoveFramesAndFeaturesBitIdenticalAndInOrder) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two CUDA devices (NCCL: one rank per device)";
  auto d = NcclChannel::NewDescriptor(kMessageBytes, kFeatureBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  constexpr int kMessages = 9;  // more than the 2 slots: the sender waits for the receiver
  // Both ends live until both are done: destroying a channel aborts its transfers.
  NcclChannel::Options so;
  so.rank = 0;
  so.device = 0;
  so.timeout = absl::Seconds(60);
  auto sender = NcclChannel::Create(*d, so);
  ASSERT_TRUE(sender.ok()) << sender.status();
  absl::Status send_status;
  std::thread sender_thread([&] {
    for (int i = 0; i < kMessages && send_status.ok(); ++i) {
      auto buffer = (*sender)->NextFeatureBuffer();
      if (!buffer.ok()) {
        send_status = buffer.status();
        break;
      }
      std::vector<uint8_t> features(FeatureSize(i)), frame(FrameSize(i));
      for (size_t k = 0; k < features.size(); ++k) features[k] = Byte(i, k, 1);
      for (size_t k = 0; k < frame.size(); ++k) frame[k] = Byte(i, k, 2);
      cudaSetDevice(0);
      cudaMemcpy(*buffer, features.data(), features.size(), cudaMemcpyHostToDevice);
      send_status = (*sender)->Send(100 + i, frame, features.size());
    }
  });
  NcclChannel::Options o;
  o.rank = 1;
  o.device = 1;
  o.timeout = absl::Seconds(60);
  auto ch = NcclChannel::Create(*d, o);
  ASSERT_TRUE(ch.ok()) << ch.status();
  for (int i = 0; i < kMessages; ++i) {
    auto frame = (*ch)->ReceiveFrame(100 + i);
    ASSERT_TRUE(frame.ok()) << "message " << i << ": " << frame.status();
    ASSERT_EQ(frame->size(), FrameSize(i));
    for (size_t k = 0; k < frame->size(); ++k) ASSERT_EQ((*frame)[k], Byte(i, k, 2)) << i;
    auto features = (*ch)->ReceiveFeatures(FeatureSize(i));
    ASSERT_TRUE(features.ok()) << features.status();
    std::vector<uint8_t> back(FeatureSize(i));
    cudaSetDevice(1);
    ASSERT_EQ(cudaMemcpy(back.data(), *features, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t k = 0; k < back.size(); ++k) ASSERT_EQ(back[k], Byte(i, k, 1)) << i << " " << k;
    ASSERT_TRUE((*ch)->Release().ok());
  }
  sender_thread.join();
  EXPECT_TRUE(send_status.ok()) << send_status;
  EXPECT_EQ((*ch)->count(), static_cast<uint64_t>(kMessages));
}

TEST(NcclChannelGpu, TwoGpusRefuseAMismatchedBatchId) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two CUDA devices (NCCL: one rank per device)";
  auto d = NcclChannel::NewDescriptor(kMessageBytes, kFeatureBytes);
  ASSERT_TRUE(d.ok()) << d.status();
  NcclChannel::Options so;
  so.timeout = absl::Seconds(20);
  auto sender = NcclChannel::Create(*d, so);
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::thread sender_thread([&] {
    if (!(*sender)->NextFeatureBuffer().ok()) return;
    std::vector<uint8_t> frame(16, 1);
    (*sender)->Send(7, frame, 64).IgnoreError();
  });
  NcclChannel::Options o;
  o.rank = 1;
  o.device = 1;
  o.timeout = absl::Seconds(20);
  auto ch = NcclChannel::Create(*d, o);
  ASSERT_TRUE(ch.ok()) << ch.status();
  auto frame = (*ch)->ReceiveFrame(8);
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kFailedPrecondition) << frame.status();
  EXPECT_NE(frame.status().message().find("batch 7"), std::string::npos) << frame.status();
  EXPECT_EQ((*ch)->ReceiveFrame(8).status().code(), absl::StatusCode::kAborted);
  sender_thread.join();
}

}  // namespace
}  // namespace dflash::transport

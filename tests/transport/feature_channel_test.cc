// The feature channel (common/transport/feature_channel.h) over the host transport, sender and
// receiver in two real processes (fork), as the target and drafter workers use it: batches and
// their features arrive in order with the CRC-32 the sender reported; a message corrupted after
// its CRC-32 is refused as DATA_LOSS and its slot can still be handed back; a batch id out of
// step is refused; Abort ends a wait. The transport names and the GPU requirement are checked.
// (cuda_ipc and nccl need a GPU: training_gpu_test and the transport benchmark run them.)
#include "common/transport/feature_channel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/common/fork.h"

namespace dflash::transport {
namespace {

using ::dflash::testing::ForkChild;
using ::dflash::testing::WaitChild;

constexpr int64_t kDim = 6;

batching::PackedBatch Batch(uint64_t b) {
  const int64_t t = 3 + static_cast<int64_t>(b % 4);
  batching::PackedBatch p;
  for (int64_t i = 0; i < t; ++i) {
    p.input_ids.push_back(static_cast<int32_t>(100 + b * 10 + i));
    p.loss_mask.push_back(1);
    p.positions.push_back(static_cast<int32_t>(i));
    p.doc_ids.push_back(0);
  }
  p.cu_seqlens = {0, static_cast<int32_t>(t)};
  p.piece_document = {0};
  p.piece_begin = {0};
  p.total_tokens = t;
  return p;
}

std::vector<float> Features(uint64_t b, int64_t t) {
  std::vector<float> f(static_cast<size_t>(t * kDim));
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(b) + 0.25f * i;
  return f;
}

FeatureChannelOptions Options(const std::string& name) {
  FeatureChannelOptions o;
  o.transport = Transport::kHost;
  o.name = name;
  o.timeout = absl::Seconds(10);
  o.open_timeout = absl::Seconds(10);
  o.max_tokens = 8;
  o.feature_dim = kDim;
  return o;
}

std::string UniqueName(const char* what) {
  return absl::StrCat("dflash-test-channel-", what, "-", getpid());
}

TEST(FeatureChannelTest, TransportNamesAndTheirDevice) {
  for (const char* name : {"host", "cuda_ipc", "nccl"}) {
    absl::StatusOr<Transport> t = ParseTransport(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(std::string(TransportName(*t)), name);
  }
  absl::StatusOr<Transport> bad = ParseTransport("infiniband");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("placement.transport: 'infiniband'"), std::string::npos);
  EXPECT_TRUE(CheckTransportDevice(Transport::kHost, -1).ok());
  for (Transport t : {Transport::kCudaIpc, Transport::kNccl}) {
    const absl::Status s = CheckTransportDevice(t, -1);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("this worker runs on the CPU"), std::string::npos) << s;
    // The factories check it before touching a device.
    FeatureChannelOptions o = Options(UniqueName("cpu"));
    o.transport = t;
    EXPECT_EQ(FeatureSender::Create(o).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(FeatureReceiver::Create(o).status().code(), absl::StatusCode::kFailedPrecondition);
  }
  FeatureChannelOptions empty = Options(UniqueName("empty"));
  empty.max_tokens = 0;
  EXPECT_EQ(FeatureSender::Create(empty).status().code(), absl::StatusCode::kInvalidArgument);
}

// The consumer's checks, as exit codes: 0 when every batch arrived as sent.
int Consume(const std::string& name, uint64_t batches, uint64_t corrupt) {
  auto r = FeatureReceiver::Create(Options(name));
  if (!r.ok()) return 10;
  if ((*r)->transport() != Transport::kHost) return 11;
  for (uint64_t b = 0; b < batches; ++b) {
    absl::StatusOr<ReceivedFeatures> got = (*r)->Receive(b);
    if (b == corrupt) {
      if (got.status().code() != absl::StatusCode::kDataLoss) return 12;
      if (!(*r)->Release().ok()) return 13;  // the slot is still handed back
      continue;
    }
    if (!got.ok() || got->on_device) return 14;
    const int64_t t = static_cast<int64_t>(got->decoded.batch.input_ids.size());
    if (got->decoded.batch.input_ids != Batch(b).input_ids || got->decoded.feature_dim != kDim) {
      return 15;
    }
    const std::vector<float> want = Features(b, t);
    if (std::memcmp(got->data, want.data(), want.size() * sizeof(float)) != 0) return 16;
    if (got->bytes <= static_cast<int64_t>(want.size() * sizeof(float))) return 17;
    // The CRC-32 that the sender reports (the step checksum's input) travels in the message.
    std::vector<uint8_t> message;
    absl::StatusOr<uint32_t> crc =
        EncodeFeatureMessage(Batch(b), want.data(), kDim, FeatureDType::kFloat32, &message);
    if (!crc.ok() || got->decoded.crc32 != *crc) return 18;
    if (!(*r)->Release().ok()) return 19;
  }
  return 0;
}

TEST(FeatureChannelTest, HostBatchesArriveInOrderAndACorruptedOneIsRefused) {
  const std::string name = UniqueName("host");
  constexpr uint64_t kBatches = 40, kCorrupt = 17;
  FeatureChannelOptions o = Options(name);
  o.after_checksum = [](void* message, size_t bytes, uint64_t index) {
    if (index == kCorrupt) static_cast<uint8_t*>(message)[bytes - 3] ^= 1;  // in the features
  };
  auto sender = FeatureSender::Create(o);
  ASSERT_TRUE(sender.ok()) << sender.status();
  EXPECT_EQ((*sender)->handoff(), name);
  EXPECT_NE((*sender)->Describe().find("host, 2 x "), std::string::npos) << (*sender)->Describe();
  const pid_t consumer = ForkChild([&] { return Consume(name, kBatches, kCorrupt); });
  for (uint64_t b = 0; b < kBatches; ++b) {
    EXPECT_EQ((*sender)->NextBuffer().value_or(reinterpret_cast<void*>(1)), nullptr);
    const batching::PackedBatch batch = Batch(b);
    const std::vector<float> f = Features(b, static_cast<int64_t>(batch.input_ids.size()));
    int64_t bytes = 0;
    absl::StatusOr<uint32_t> crc = (*sender)->Send(b, batch, f.data(), &bytes);
    ASSERT_TRUE(crc.ok()) << crc.status();
    std::vector<uint8_t> message;
    EXPECT_EQ(
        *crc,
        EncodeFeatureMessage(batch, f.data(), kDim, FeatureDType::kFloat32, &message).value_or(0));
    EXPECT_GT(bytes, static_cast<int64_t>(f.size() * sizeof(float)));
    EXPECT_LE((*sender)->Depth(), 2);
  }
  EXPECT_EQ(WaitChild(consumer), 0);
}

TEST(FeatureChannelTest, ABatchOutOfStepIsRefusedAndAbortEndsAWait) {
  const std::string name = UniqueName("step");
  auto sender = FeatureSender::Create(Options(name));
  ASSERT_TRUE(sender.ok()) << sender.status();
  const batching::PackedBatch batch = Batch(0);
  const std::vector<float> f = Features(0, static_cast<int64_t>(batch.input_ids.size()));
  ASSERT_TRUE((*sender)->Send(5, batch, f.data(), nullptr).ok());
  auto receiver = FeatureReceiver::Create(Options(name));
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  absl::StatusOr<ReceivedFeatures> wrong = (*receiver)->Receive(4);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_NE(wrong.status().message().find("receiving batch 4: "), std::string::npos);
  // A second receiver waits for a batch that never comes, until another thread aborts it.
  const std::string idle = UniqueName("idle");
  auto quiet = FeatureSender::Create(Options(idle));
  ASSERT_TRUE(quiet.ok());
  auto waiting = FeatureReceiver::Create(Options(idle));
  ASSERT_TRUE(waiting.ok());
  std::thread aborter([&] {
    // ABORTED whenever it lands (before the ring is opened, or during the wait); the pause makes
    // it land during the wait on any machine but a stalled one.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (*waiting)->Abort();
  });
  absl::StatusOr<ReceivedFeatures> aborted = (*waiting)->Receive(0);
  aborter.join();
  EXPECT_EQ(aborted.status().code(), absl::StatusCode::kAborted) << aborted.status();
}

}  // namespace
}  // namespace dflash::transport

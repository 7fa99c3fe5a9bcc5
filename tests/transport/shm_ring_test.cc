// The host feature transport (common/transport/shm_ring.h) between two real processes (fork): a
// producer runs ahead by at most the ring's slots and every batch arrives intact and in order; a
// batch-id mismatch is refused and not consumed; waits end at their deadline; Abort ends the
// peer's wait; names and sizes are checked.
#include "common/transport/shm_ring.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/common/fork.h"

namespace dflash::transport {
namespace {

std::string UniqueName(const char* what) {
  return absl::StrCat("dflash-test-", what, "-", getpid());
}

std::vector<uint8_t> Payload(uint64_t batch, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((batch * 131 + i * 7) & 0xff);
  return v;
}

using ::dflash::testing::ForkChild;
using ::dflash::testing::WaitChild;

TEST(ShmRingTest, BatchesCrossProcessesIntactAndInOrder) {
  const std::string name = UniqueName("order");
  auto ring = ShmRing::Create(name, {2, 4096});
  ASSERT_TRUE(ring.ok()) << ring.status();
  const pid_t consumer = ForkChild([&] {
    auto r = ShmRing::Open(name, absl::Seconds(10));
    if (!r.ok()) return 10;
    for (uint64_t b = 0; b < 200; ++b) {
      auto got = (*r)->Receive(b, absl::Seconds(10));
      if (!got.ok()) return 11;
      const std::vector<uint8_t> want = Payload(b, 1 + (b * 37) % 4096);
      if (got->size() != want.size() || !std::equal(want.begin(), want.end(), got->begin())) {
        return 12;
      }
      if (!(*r)->Release().ok()) return 13;
    }
    return 0;
  });
  for (uint64_t b = 0; b < 200; ++b) {
    const std::vector<uint8_t> p = Payload(b, 1 + (b * 37) % 4096);
    ASSERT_TRUE((*ring)->Send(b, p, absl::Seconds(10)).ok()) << "batch " << b;
  }
  EXPECT_EQ(WaitChild(consumer), 0);
}

// WaitFree: the producer of out-of-ring payloads (cuda_ipc) waits until the consumer hands the
// slot back, and no longer; Depth counts the slots not yet handed back.
TEST(ShmRingTest, WaitFreeWaitsForTheConsumersRelease) {
  const std::string name = UniqueName("waitfree");
  auto ring = ShmRing::Create(name, {2, 64});
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto reader = ShmRing::Open(name, absl::Seconds(1));
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*ring)->WaitFree(absl::Milliseconds(10)).ok());  // empty ring
  ASSERT_TRUE((*ring)->Send(1, Payload(1, 8), absl::Seconds(1)).ok());
  ASSERT_TRUE((*ring)->Send(2, Payload(2, 8), absl::Seconds(1)).ok());
  EXPECT_EQ((*ring)->Depth(), 2u);
  ASSERT_TRUE((*reader)->Receive(1, absl::Seconds(1)).ok());  // held: slot 0 not yet free
  EXPECT_EQ((*reader)->Depth(), 2u);
  EXPECT_EQ((*ring)->WaitFree(absl::Milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE((*reader)->Release().ok());
  EXPECT_EQ((*ring)->Depth(), 1u);
  EXPECT_TRUE((*ring)->WaitFree(absl::Milliseconds(10)).ok());
}

TEST(ShmRingTest, RefusesAnotherBatchIdWithoutConsumingIt) {
  const std::string name = UniqueName("mismatch");
  auto ring = ShmRing::Create(name, {2, 64});
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto reader = ShmRing::Open(name, absl::Seconds(1));
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*ring)->Send(7, Payload(7, 10), absl::Seconds(1)).ok());
  auto wrong = (*reader)->Receive(6, absl::Seconds(1));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("expected batch 6, received batch 7"), std::string::npos)
      << wrong.status();
  auto right = (*reader)->Receive(7, absl::Seconds(1));  // still there
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(right->size(), 10u);
  EXPECT_TRUE((*reader)->Release().ok());
  EXPECT_FALSE((*reader)->Release().ok()) << "nothing held";
}

TEST(ShmRingTest, WaitsEndAtTheirDeadline) {
  const std::string name = UniqueName("deadline");
  auto ring = ShmRing::Create(name, {1, 16});
  ASSERT_TRUE(ring.ok());
  auto reader = ShmRing::Open(name, absl::Seconds(1));
  ASSERT_TRUE(reader.ok());
  auto nothing = (*reader)->Receive(0, absl::Milliseconds(30));
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kDeadlineExceeded) << nothing.status();
  ASSERT_TRUE((*ring)->Send(0, Payload(0, 16), absl::Seconds(1)).ok());
  // One slot, not released: the producer cannot run further ahead.
  auto full = (*ring)->Send(1, Payload(1, 16), absl::Milliseconds(30));
  EXPECT_EQ(full.code(), absl::StatusCode::kDeadlineExceeded) << full;
  EXPECT_EQ(ShmRing::Open(UniqueName("absent"), absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(ShmRingTest, AbortEndsThePeersWait) {
  const std::string name = UniqueName("abort");
  auto ring = ShmRing::Create(name, {2, 16});
  ASSERT_TRUE(ring.ok());
  const pid_t consumer = ForkChild([&] {
    auto r = ShmRing::Open(name, absl::Seconds(10));
    if (!r.ok()) return 10;
    // Blocks (no batch is ever sent) until the producer aborts; a minute is far past the test.
    auto got = (*r)->Receive(0, absl::Minutes(1));
    return got.status().code() == absl::StatusCode::kAborted ? 0 : 11;
  });
  // The consumer's Receive happens before or after this Abort (no sleep orders them): either the
  // futex wake or the flag check ends it with ABORTED instead of at its one-minute deadline.
  (*ring)->Abort();
  EXPECT_EQ(WaitChild(consumer), 0);
  EXPECT_EQ((*ring)->Send(0, Payload(0, 4), absl::Seconds(1)).code(), absl::StatusCode::kAborted);
}

TEST(ShmRingTest, ChecksNamesAndSizes) {
  EXPECT_EQ(ShmRing::Create("bad/name", {2, 16}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRing::Create(UniqueName("zero"), {0, 16}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string name = UniqueName("size");
  auto ring = ShmRing::Create(name, {2, 16});
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ(ShmRing::Create(name, {2, 16}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*ring)->Send(0, Payload(0, 17), absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dflash::transport

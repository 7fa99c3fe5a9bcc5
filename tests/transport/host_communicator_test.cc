// The host communicator among data-parallel drafters (common/transport/host_communicator.h),
// between real processes (fork): sums over several rounds and chunk boundaries equal the
// rank-ordered sum bit for bit on every rank; a missing rank ends the wait at the deadline and
// aborts the others; an abort from one rank ends every other rank's wait; mismatched worlds and
// bad ranks are refused.
#include "common/transport/host_communicator.h"

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
  return absl::StrCat("dflash-test-comm-", what, "-", getpid());
}

using ::dflash::testing::ForkChild;
using ::dflash::testing::WaitChild;

// Rank r's contribution in round k: values whose fp32 sums depend on the order of the terms.
template <typename T>
std::vector<T> Contribution(int rank, int round, size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<T>(
        (static_cast<double>((i * 7919 + rank * 104729 + round * 13) % 1000) - 500.0) *
        (rank == 1 ? 1e-7 : 1.0) / 3.0);
  }
  return v;
}

template <typename T>
std::vector<T> Expected(int world, int round, size_t n) {
  std::vector<T> sum = Contribution<T>(0, round, n);
  for (int r = 1; r < world; ++r) {
    const std::vector<T> c = Contribution<T>(r, round, n);
    for (size_t i = 0; i < n; ++i) sum[i] += c[i];
  }
  return sum;
}

// One rank of a world of `world`: 20 rounds of fp32 and fp64 sums over 1000 elements in 64-byte
// chunks; returns 0 when every result equals the rank-ordered sum bit for bit.
int RunRank(const std::string& name, int rank, int world) {
  HostCommunicator::Options o;
  o.rank = rank;
  o.world = world;
  o.chunk_bytes = 64;
  o.timeout = absl::Seconds(30);
  o.open_timeout = absl::Seconds(30);
  auto c = HostCommunicator::Create(name, o);
  if (!c.ok()) return 10;
  for (int round = 0; round < 20; ++round) {
    std::vector<float> f = Contribution<float>(rank, round, 1000);
    if (!(*c)->AllReduceSum(f.data(), f.size(), ReduceType::kFloat32, false).ok()) return 11;
    if (f != Expected<float>(world, round, 1000)) return 12;
    std::vector<double> d = Contribution<double>(rank, round, 333);
    if (!(*c)->AllReduceSum(d.data(), d.size(), ReduceType::kFloat64, false).ok()) return 13;
    if (d != Expected<double>(world, round, 333)) return 14;
  }
  return 0;
}

TEST(HostCommunicatorTest, ThreeProcessesSumBitIdenticallyInRankOrder) {
  const std::string name = UniqueName("sum");
  std::vector<pid_t> ranks;
  for (int r = 2; r >= 0; --r) ranks.push_back(ForkChild([&] { return RunRank(name, r, 3); }));
  for (pid_t p : ranks) EXPECT_EQ(WaitChild(p), 0);
}

TEST(HostCommunicatorTest, OneRankIsANoOp) {
  auto c = HostCommunicator::Create(UniqueName("one"), {});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> v = {1.5f, -2.0f};
  ASSERT_TRUE((*c)->AllReduceSum(v.data(), v.size(), ReduceType::kFloat32, false).ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
}

TEST(HostCommunicatorTest, AMissingRankEndsTheWaitAtTheDeadline) {
  HostCommunicator::Options o;
  o.world = 2;
  o.timeout = absl::Milliseconds(200);
  auto c = HostCommunicator::Create(UniqueName("deadline"), o);
  ASSERT_TRUE(c.ok()) << c.status();
  double x = 1;
  absl::Status s = (*c)->AllReduceSum(&x, 1, ReduceType::kFloat64, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 0 waited"), std::string::npos) << s;
  // Aborted on expiry: later calls fail at once.
  EXPECT_EQ((*c)->AllReduceSum(&x, 1, ReduceType::kFloat64, false).code(),
            absl::StatusCode::kAborted);
}

TEST(HostCommunicatorTest, AnAbortFromOneRankEndsTheOthersWait) {
  const std::string name = UniqueName("abort");
  HostCommunicator::Options o;
  o.world = 2;
  o.timeout = absl::Seconds(60);
  auto c = HostCommunicator::Create(name, o);
  ASSERT_TRUE(c.ok()) << c.status();
  const pid_t peer = ForkChild([&] {
    HostCommunicator::Options p = o;
    p.rank = 1;
    auto mine = HostCommunicator::Create(name, p);
    if (!mine.ok()) return 10;
    (*mine)->Abort();
    return 0;
  });
  double x = 1;
  const absl::Time start = absl::Now();
  absl::Status s = (*c)->AllReduceSum(&x, 1, ReduceType::kFloat64, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(WaitChild(peer), 0);
}

TEST(HostCommunicatorTest, RefusesBadRanksWorldsAndDeviceMemory) {
  HostCommunicator::Options o;
  o.world = 2;
  o.rank = 2;
  auto bad = HostCommunicator::Create(UniqueName("rank"), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rank 2 is outside a world of 2"), std::string::npos);

  const std::string name = UniqueName("world");
  o.rank = 0;
  auto zero = HostCommunicator::Create(name, o);
  ASSERT_TRUE(zero.ok()) << zero.status();
  HostCommunicator::Options other = o;
  other.rank = 1;
  other.world = 3;
  other.open_timeout = absl::Seconds(5);
  auto mismatched = HostCommunicator::Create(name, other);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatched.status().message().find("world of 2"), std::string::npos)
      << mismatched.status();

  float f = 0;
  EXPECT_EQ((*zero)->AllReduceSum(&f, 1, ReduceType::kFloat32, true).code(),
            absl::StatusCode::kInvalidArgument);
  // 16-bit sums are the nccl communicator's (a tensor-parallel target on GPUs).
  uint16_t half = 0;
  EXPECT_EQ((*zero)->AllReduceSum(&half, 1, ReduceType::kBFloat16, false).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dflash::transport

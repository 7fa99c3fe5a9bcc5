// Tensor-parallel decoding groups (services/coordinator/decode_group.h): the fields each rank's
// call carries, who opens an NCCL group, and which failure of a group's call is reported.
#include "services/coordinator/decode_group.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/fake_worker_control.h"

namespace dflash::coordinator {
namespace {

v1::WorkerInfo Target(const std::string& name, const std::string& kind, int index) {
  v1::WorkerInfo w;
  w.set_name(name);
  w.set_worker_id(name);
  w.set_role(v1::WORKER_ROLE_TARGET);
  w.set_control_address("10.0.0.1:700" + std::to_string(index));
  w.mutable_device()->set_kind(kind);
  w.mutable_device()->set_index(index);
  return w;
}

// Records OpenDecodeGroup calls and answers with an id naming the worker.
class OpeningControl : public FakeWorkerControl {
 public:
  absl::StatusOr<v1::OpenDecodeGroupResponse> OpenDecodeGroup(
      const v1::WorkerInfo& worker, const v1::OpenDecodeGroupRequest& req) override {
    opened.push_back(worker.name() + ":" + req.collective());
    v1::OpenDecodeGroupResponse resp;
    resp.set_nccl_unique_id("id-of-" + worker.name());
    return resp;
  }
  std::vector<std::string> opened;
};

TEST(DecodeGroupTest, AGpuGroupIsOpenedByRankZeroAndEveryRankJoinsWithItsId) {
  OpeningControl control;
  const DecodeGroupWorkers group = {Target("g0", "cuda", 0), Target("g1", "cuda", 1)};
  auto fields = OpenDecodeGroup(group, "dflash-eval-1", &control);
  ASSERT_TRUE(fields.ok()) << fields.status();
  ASSERT_EQ(fields->size(), 2u);
  EXPECT_EQ(control.opened, std::vector<std::string>{"g0:nccl"});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((*fields)[r].rank(), r);
    EXPECT_EQ((*fields)[r].world(), 2);
    EXPECT_EQ((*fields)[r].collective(), "nccl");
    EXPECT_EQ((*fields)[r].nccl_unique_id(), "id-of-g0");
  }
}

TEST(DecodeGroupTest, ACpuGroupSharesMemoryUnderTheCallsNameWithoutOpening) {
  OpeningControl control;
  const DecodeGroupWorkers group = {Target("c0", "cpu", -1), Target("c1", "cpu", -1)};
  auto fields = OpenDecodeGroup(group, "dflash-regen-7", &control);
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_TRUE(control.opened.empty());
  EXPECT_EQ((*fields)[1].collective(), "host");
  EXPECT_EQ((*fields)[1].name(), "dflash-regen-7");
  EXPECT_EQ((*fields)[1].rank(), 1);
  // One worker: the plain call.
  auto alone = OpenDecodeGroup({Target("c0", "cpu", -1)}, "x", &control);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*alone)[0].world(), 1);
}

TEST(DecodeGroupTest, AGroupCallAnswersRankZerosResultOrTheCauseOfItsFailure) {
  const DecodeGroupWorkers group = {Target("t0", "cpu", -1), Target("t1", "cpu", -1)};
  std::vector<v1::DecodeGroup> fields(2);
  fields[0].set_rank(0);
  fields[1].set_rank(1);
  auto ok = OnEveryRank<int>(
      group, fields, [](const v1::WorkerInfo&, const v1::DecodeGroup& f) -> absl::StatusOr<int> {
        return 10 + f.rank();
      });
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 10);
  // Rank 1 runs out of memory; rank 0's sum then ends ABORTED: the report is rank 1's cause.
  auto failed = OnEveryRank<int>(
      group, fields, [](const v1::WorkerInfo&, const v1::DecodeGroup& f) -> absl::StatusOr<int> {
        if (f.rank() == 0) return absl::AbortedError("all-reduce dflash-eval-3 aborted");
        return absl::ResourceExhaustedError("target model extend: out of memory");
      });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(failed.status().message(), "rank 1 of 2 (t1): target model extend: out of memory");
  // Only aborts: the first.
  EXPECT_EQ(GroupFailure({absl::AbortedError("a"), absl::AbortedError("b")}).message(), "a");
}

}  // namespace
}  // namespace dflash::coordinator

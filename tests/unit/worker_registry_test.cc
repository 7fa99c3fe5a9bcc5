#include "services/coordinator/worker_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/base/clock.h"

namespace dflash::coordinator {
namespace {

v1::WorkerInfo Worker(const std::string& name, v1::WorkerRole role) {
  v1::WorkerInfo w;
  w.set_name(name);
  w.set_role(role);
  w.set_control_address("127.0.0.1:1");
  return w;
}

TEST(WorkerRegistry, SilentWorkerGoesDownExactlyAfterTheTimeout) {
  FakeClock clock;
  WorkerRegistry reg(&clock, /*timeout_ms=*/1000, "a1b2");
  auto id = reg.Register(Worker("t0", v1::WORKER_ROLE_TARGET));
  ASSERT_TRUE(id.ok());
  clock.AdvanceMs(1000);
  EXPECT_TRUE(reg.Sweep().empty());  // exactly at the timeout: still up
  clock.AdvanceMs(1);
  auto down = reg.Sweep();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].worker_id(), *id);
  EXPECT_EQ(reg.Get(*id)->health(), v1::WORKER_HEALTH_DOWN);
  EXPECT_TRUE(reg.Sweep().empty());  // reported once
}

TEST(WorkerRegistry, HeartbeatsKeepAWorkerUpAndRevive) {
  FakeClock clock;
  WorkerRegistry reg(&clock, 1000, "a1b2");
  std::string id = *reg.Register(Worker("d0", v1::WORKER_ROLE_DRAFTER));
  for (int i = 0; i < 10; ++i) {
    clock.AdvanceMs(900);
    ASSERT_TRUE(reg.Heartbeat(id, v1::DeviceInfo()).ok());
    EXPECT_TRUE(reg.Sweep().empty());
  }
  clock.AdvanceMs(5000);
  EXPECT_EQ(reg.Sweep().size(), 1u);
  EXPECT_TRUE(reg.IdleWorkers(v1::WORKER_ROLE_DRAFTER).empty());
  ASSERT_TRUE(reg.Heartbeat(id, v1::DeviceInfo()).ok());
  EXPECT_EQ(reg.Get(id)->health(), v1::WORKER_HEALTH_UP);
  EXPECT_EQ(reg.IdleWorkers(v1::WORKER_ROLE_DRAFTER).size(), 1u);
}

TEST(WorkerRegistry, IdsNameTheCoordinatorIncarnation) {
  FakeClock clock;
  WorkerRegistry before(&clock, 1000, "a1b2");
  WorkerRegistry after(&clock, 1000, "c3d4");  // the same coordinator after a restart
  EXPECT_EQ(*before.Register(Worker("t0", v1::WORKER_ROLE_TARGET)), "w1-a1b2");
  EXPECT_EQ(*after.Register(Worker("d0", v1::WORKER_ROLE_DRAFTER)), "w1-c3d4");
  // t0 still holds its old id: the new registry must not take it for d0.
  EXPECT_EQ(after.Heartbeat("w1-a1b2", v1::DeviceInfo()).code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistry, UnknownHeartbeatIsNotFound) {
  FakeClock clock;
  WorkerRegistry reg(&clock, 1000, "a1b2");
  EXPECT_EQ(reg.Heartbeat("w9", v1::DeviceInfo()).code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistry, ReRegistrationKeepsIdAndDropsAssignment) {
  FakeClock clock;
  WorkerRegistry reg(&clock, 1000, "a1b2");
  std::string id = *reg.Register(Worker("t0", v1::WORKER_ROLE_TARGET));
  ASSERT_TRUE(reg.Assign(id, "r1").ok());
  EXPECT_TRUE(reg.IdleWorkers(v1::WORKER_ROLE_TARGET).empty());
  EXPECT_EQ(*reg.Register(Worker("t0", v1::WORKER_ROLE_TARGET)), id);
  EXPECT_EQ(reg.Get(id)->run_id(), "");
  EXPECT_EQ(reg.List().size(), 1u);
  // Same name, other role: refused.
  EXPECT_EQ(reg.Register(Worker("t0", v1::WORKER_ROLE_DRAFTER)).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(WorkerRegistry, RejectsIncompleteRegistrations) {
  FakeClock clock;
  WorkerRegistry reg(&clock, 1000, "a1b2");
  EXPECT_THAT(std::string(reg.Register(Worker("", v1::WORKER_ROLE_TARGET)).status().message()),
              ::testing::HasSubstr("worker.name"));
  EXPECT_THAT(
      std::string(reg.Register(Worker("x", v1::WORKER_ROLE_UNSPECIFIED)).status().message()),
      ::testing::HasSubstr("worker.role"));
  v1::WorkerInfo w = Worker("x", v1::WORKER_ROLE_TARGET);
  w.clear_control_address();
  EXPECT_THAT(std::string(reg.Register(w).status().message()),
              ::testing::HasSubstr("worker.control_address"));
}

TEST(WorkerRegistry, AssignmentAndRelease) {
  FakeClock clock;
  WorkerRegistry reg(&clock, 1000, "a1b2");
  std::string t = *reg.Register(Worker("t0", v1::WORKER_ROLE_TARGET));
  std::string d = *reg.Register(Worker("d0", v1::WORKER_ROLE_DRAFTER));
  ASSERT_TRUE(reg.Assign(t, "r1").ok());
  ASSERT_TRUE(reg.Assign(d, "r1").ok());
  EXPECT_EQ(reg.Assign(t, "r2").code(), absl::StatusCode::kFailedPrecondition);
  reg.ReleaseRun("r1");
  EXPECT_EQ(reg.IdleWorkers(v1::WORKER_ROLE_TARGET).size(), 1u);
  EXPECT_EQ(reg.IdleWorkers(v1::WORKER_ROLE_DRAFTER).size(), 1u);
}

}  // namespace
}  // namespace dflash::coordinator

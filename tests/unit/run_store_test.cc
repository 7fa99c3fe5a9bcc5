#include "services/coordinator/run_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

namespace dflash::coordinator {
namespace {

using ::testing::HasSubstr;

v1::RunStatus NewRun(const std::string& id) {
  v1::RunStatus r;
  r.set_run_id(id);
  r.set_name("demo");
  r.set_message("queued for test");
  r.set_resolved_config_yaml("name: demo\n");
  return r;
}

TEST(RunStore, CreateTransitionAndEvents) {
  auto store = RunStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->CreateRun(NewRun("r1"), "src", 1000).ok());
  auto e = (*store)->Transition("r1", v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING, "placed", 2000);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->seq(), 2);
  auto run = (*store)->GetRun("r1");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->state(), v1::RUN_STATE_STARTING);
  EXPECT_EQ(run->message(), "placed");
  EXPECT_EQ(run->created_unix_ms(), 1000);
  EXPECT_EQ(run->updated_unix_ms(), 2000);
  auto events = (*store)->EventsAfter("r1", 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].to_state(), v1::RUN_STATE_QUEUED);
  EXPECT_EQ((*events)[1].from_state(), v1::RUN_STATE_QUEUED);
  EXPECT_EQ((*events)[1].to_state(), v1::RUN_STATE_STARTING);
  EXPECT_EQ((*store)->EventsAfter("r1", 1)->size(), 1u);
}

TEST(RunStore, TransitionChecksTheCurrentState) {
  auto store = *RunStore::Open(":memory:");
  ASSERT_TRUE(store->CreateRun(NewRun("r1"), "", 1).ok());
  // Stale writer: thinks the run is starting.
  auto e = store->Transition("r1", v1::RUN_STATE_STARTING, v1::RUN_STATE_RUNNING, "", 2);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(e.status().message(), HasSubstr("is queued, not starting"));
  // Not in the table at all.
  e = store->Transition("r1", v1::RUN_STATE_QUEUED, v1::RUN_STATE_DONE, "", 2);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->GetRun("r1")->state(), v1::RUN_STATE_QUEUED);
  EXPECT_EQ(store->EventsAfter("r1", 0)->size(), 1u);  // nothing half-written
  EXPECT_EQ(store->GetRun("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->CreateRun(NewRun("r1"), "", 3).code(), absl::StatusCode::kInternal);
  // A refused transition leaves the worker list untouched too.
  const std::vector<std::string> workers = {"w1"};
  EXPECT_FALSE(
      store->Transition("r1", v1::RUN_STATE_STARTING, v1::RUN_STATE_RUNNING, "", 4, &workers).ok());
  EXPECT_EQ(store->GetRun("r1")->worker_ids_size(), 0);
}

TEST(RunStore, SurvivesReopen) {
  char tmpl[] = "/tmp/dflash-store-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/runs.sqlite";
  {
    auto store = *RunStore::Open(path);
    ASSERT_TRUE(store->CreateRun(NewRun("r1"), "", 1).ok());
    ASSERT_TRUE(store->CreateRun(NewRun("r2"), "", 2).ok());
    ASSERT_TRUE(
        store->Transition("r2", v1::RUN_STATE_QUEUED, v1::RUN_STATE_CANCELLED, "bye", 3).ok());
    const std::vector<std::string> workers = {"w1", "w2"};
    ASSERT_TRUE(
        store->Transition("r1", v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING, "placed", 4, &workers)
            .ok());
  }
  auto store = *RunStore::Open(path);
  auto runs = store->ListRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].run_id(), "r1");
  ASSERT_EQ((*runs)[0].worker_ids_size(), 2);
  EXPECT_EQ((*runs)[0].worker_ids(1), "w2");
  EXPECT_EQ((*runs)[0].state(), v1::RUN_STATE_STARTING);
  EXPECT_EQ((*runs)[1].state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ((*runs)[1].message(), "bye");
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace dflash::coordinator

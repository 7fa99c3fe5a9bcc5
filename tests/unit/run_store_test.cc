#include "services/coordinator/run_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

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

TEST(RunStore, KeepsTotalStepsAndTheDataSummary) {
  auto store = *RunStore::Open(":memory:");
  v1::RunStatus run = NewRun("r1");
  run.set_total_steps(1234);
  run.mutable_data()->set_documents(99);
  (*run.mutable_data()->mutable_skipped_by_reason())["malformed_json"] = 3;
  ASSERT_TRUE(store->CreateRun(run, "", 1).ok());
  ASSERT_TRUE(store->CreateRun(NewRun("r2"), "", 2).ok());
  auto got = store->GetRun("r1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->total_steps(), 1234);
  EXPECT_EQ(got->data().documents(), 99);
  EXPECT_EQ(got->data().skipped_by_reason().at("malformed_json"), 3);
  EXPECT_FALSE(store->GetRun("r2")->has_data());
}

// A store created before the data_summary and resolved_target columns existed is upgraded in
// place and keeps its runs.
TEST(RunStore, UpgradesAStoreWithoutTheDataColumn) {
  char tmpl[] = "/tmp/dflash-store-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/runs.sqlite";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const char* old_schema =
      "CREATE TABLE runs (run_id TEXT PRIMARY KEY, name TEXT NOT NULL, state INTEGER NOT NULL, "
      "message TEXT NOT NULL DEFAULT '', step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER NOT "
      "NULL DEFAULT 0, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, worker_ids TEXT "
      "NOT NULL DEFAULT '', resolved_yaml TEXT NOT NULL, source_yaml TEXT NOT NULL);"
      "INSERT INTO runs (run_id, name, state, created_ms, updated_ms, resolved_yaml, source_yaml) "
      "VALUES ('old', 'demo', 1, 5, 5, 'name: demo', '');";
  ASSERT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = RunStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto old = (*store)->GetRun("old");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->state(), v1::RUN_STATE_QUEUED);
  EXPECT_FALSE(old->has_data());
  EXPECT_FALSE(old->has_resolved_target());
  v1::RunStatus run = NewRun("new");
  run.mutable_data()->set_tokens(7);
  run.mutable_resolved_target()->set_mask_token_id(3);
  ASSERT_TRUE((*store)->CreateRun(run, "", 6).ok());
  EXPECT_EQ((*store)->GetRun("new")->data().tokens(), 7);
  EXPECT_EQ((*store)->GetRun("new")->resolved_target().mask_token_id(), 3);
  // The run's start replaces it.
  v1::ResolvedTarget resolved;
  resolved.add_target_layer_ids(2);
  resolved.set_mask_token_id(4);
  ASSERT_TRUE((*store)->SetResolvedTarget("old", resolved).ok());
  EXPECT_EQ((*store)->GetRun("old")->resolved_target().mask_token_id(), 4);
  EXPECT_EQ((*store)->GetRun("old")->resolved_target().target_layer_ids(0), 2);
  store->reset();
  std::filesystem::remove_all(tmpl);
}

// Steps are committed exactly once and in order, only while the run is running; a retried commit
// of the same step is accepted without effect; the last committed step survives a reopen.
TEST(RunStore, CommitsStepsExactlyOnceAndInOrder) {
  const std::string path = ::testing::TempDir() + "/steps_" + std::to_string(getpid()) + ".db";
  std::filesystem::remove(path);
  {
    auto store = *RunStore::Open(path);
    ASSERT_TRUE(store->CreateRun(NewRun("r1"), "", 1).ok());
    auto early = store->CommitStep("r1", 0, "c0", "{}", 2);
    EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << "queued run";
    EXPECT_THAT(std::string(early.status().message()), HasSubstr("not running"));
    ASSERT_TRUE(store->Transition("r1", v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING, "", 3).ok());
    ASSERT_TRUE(store->Transition("r1", v1::RUN_STATE_STARTING, v1::RUN_STATE_RUNNING, "", 4).ok());
    EXPECT_FALSE(store->LastCommittedStep("r1")->has_value());
    EXPECT_TRUE(*store->CommitStep("r1", 0, "c0", "{\"loss\": 5.1}", 5));
    EXPECT_TRUE(*store->CommitStep("r1", 1, "c1", "{\"loss\": 4.9}", 6));
    EXPECT_FALSE(*store->CommitStep("r1", 1, "c1", "{\"loss\": 4.9}", 7)) << "retried commit";
    auto other = store->CommitStep("r1", 1, "cX", "{}", 8);
    EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(other.status().message()), HasSubstr("another data cursor"));
    auto gap = store->CommitStep("r1", 3, "c3", "{}", 9);
    EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(gap.status().message()), HasSubstr("step 3 committed before step 2"));
    EXPECT_EQ(store->GetRun("r1")->step(), 2);
    EXPECT_EQ(store->CommitStep("nope", 0, "", "", 1).status().code(), absl::StatusCode::kNotFound);
  }
  auto reopened = *RunStore::Open(path);
  auto last = reopened->LastCommittedStep("r1");
  ASSERT_TRUE(last.ok() && last->has_value()) << last.status();
  EXPECT_EQ((*last)->step, 1);
  EXPECT_EQ((*last)->cursor, "c1");
  EXPECT_EQ((*last)->metrics, "{\"loss\": 4.9}");
  EXPECT_EQ((*last)->unix_ms, 6);
  EXPECT_EQ(reopened->GetRun("r1")->step(), 2);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dflash::coordinator

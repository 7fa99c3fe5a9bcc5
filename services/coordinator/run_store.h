// Durable run state in SQLite (WAL): the runs table, an append-only log of every transition, and
// the committed steps.
// A transition is one transaction that checks the expected current state, so two writers can never
// both move a run out of the same state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dflash/v1/common.pb.h"

struct sqlite3;

namespace dflash::coordinator {

// One committed optimizer step.
struct CommittedStep {
  int64_t step = 0;     // 0-based
  std::string cursor;   // the data cursor after the step (batching::SerializeCursor)
  std::string metrics;  // JSON: loss, accuracy, timings, ... as reported
  int64_t unix_ms = 0;
};

class RunStore {
 public:
  // Opens (creating if needed) the database file; ":memory:" for tests.
  static absl::StatusOr<std::unique_ptr<RunStore>> Open(const std::string& path);
  ~RunStore();
  RunStore(const RunStore&) = delete;
  RunStore& operator=(const RunStore&) = delete;

  // Inserts a new run in state QUEUED and its first event. run.run_id must be unique. The run's
  // total_steps, data summary and resolved target are stored with it.
  absl::Status CreateRun(const v1::RunStatus& run, const std::string& source_yaml, int64_t now_ms);

  // Replaces the run's resolved target settings (RunStatus.resolved_target).
  absl::Status SetResolvedTarget(const std::string& run_id, const v1::ResolvedTarget& resolved);
  // Replaces the message of a run that is still queued (why it waits); no event is written.
  absl::Status SetQueuedMessage(const std::string& run_id, const std::string& message);

  // Moves the run from `from` to `to`, recording `message`; fails with FAILED_PRECONDITION when the
  // run is not in `from` or the transition is not allowed. Returns the event written.
  // When `worker_ids` is given, the run's worker list is replaced in the same transaction, so a
  // placement is recorded with its workers or not at all.
  absl::StatusOr<v1::RunEvent> Transition(const std::string& run_id, v1::RunState from,
                                          v1::RunState to, const std::string& message,
                                          int64_t now_ms,
                                          const std::vector<std::string>* worker_ids = nullptr);

  // Records optimizer step `step` of a RUNNING run as trained, with the data cursor after it and
  // its metrics, and sets the run's step to step + 1, in one transaction: exactly once and in
  // order. Returns true when recorded; false when this step was already committed with the same
  // cursor (a retried commit: nothing changes). FAILED_PRECONDITION for a step committed with
  // another cursor, a step that is not the next one, or a run that is not running.
  absl::StatusOr<bool> CommitStep(const std::string& run_id, int64_t step,
                                  const std::string& cursor, const std::string& metrics,
                                  int64_t now_ms);
  // The run's highest committed step (nullopt before the first): where a resumed run continues.
  absl::StatusOr<std::optional<CommittedStep>> LastCommittedStep(const std::string& run_id);

  absl::StatusOr<v1::RunStatus> GetRun(const std::string& run_id);
  // All runs, oldest first.
  absl::StatusOr<std::vector<v1::RunStatus>> ListRuns();
  // Events of a run with seq > after_seq, in order.
  absl::StatusOr<std::vector<v1::RunEvent>> EventsAfter(const std::string& run_id,
                                                        int64_t after_seq);

 private:
  explicit RunStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const std::string& sql);
  // Runs `body` inside BEGIN IMMEDIATE ... COMMIT, rolled back when it fails.
  absl::Status InTransaction(const std::function<absl::Status()>& body);
  absl::Status Migrate();
  sqlite3* db_;
};

}  // namespace dflash::coordinator

#include "services/coordinator/run_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"
#include "common/rpc/run_state.h"

namespace dflash::coordinator {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  state INTEGER NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  step INTEGER NOT NULL DEFAULT 0,
  total_steps INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  worker_ids TEXT NOT NULL DEFAULT '',
  resolved_yaml TEXT NOT NULL,
  source_yaml TEXT NOT NULL,
  data_summary BLOB NOT NULL DEFAULT x'',
  resolved_target BLOB NOT NULL DEFAULT x''
);
CREATE TABLE IF NOT EXISTS run_events (
  run_id TEXT NOT NULL REFERENCES runs(run_id),
  seq INTEGER NOT NULL,
  unix_ms INTEGER NOT NULL,
  from_state INTEGER NOT NULL,
  to_state INTEGER NOT NULL,
  message TEXT NOT NULL,
  step INTEGER NOT NULL,
  PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS run_steps (
  run_id TEXT NOT NULL REFERENCES runs(run_id),
  step INTEGER NOT NULL,
  cursor TEXT NOT NULL,
  metrics TEXT NOT NULL,
  unix_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, step)
);
)sql";

// RAII prepared statement with bind helpers; errors carry the SQL error text.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  absl::Status status() const {
    if (rc_ == SQLITE_OK) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  // Returns true while a row is available.
  absl::StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return absl::InternalError(absl::StrCat("sqlite step: ", sqlite3_errmsg(db_)));
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Blob(int col) {
    const void* b = sqlite3_column_blob(stmt_, col);
    return b ? std::string(static_cast<const char*>(b), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  std::string Text(int col) {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

v1::RunStatus RowToRun(Stmt& s) {
  v1::RunStatus r;
  r.set_run_id(s.Text(0));
  r.set_name(s.Text(1));
  r.set_state(static_cast<v1::RunState>(s.Int(2)));
  r.set_message(s.Text(3));
  r.set_step(s.Int(4));
  r.set_total_steps(s.Int(5));
  r.set_created_unix_ms(s.Int(6));
  r.set_updated_unix_ms(s.Int(7));
  for (const auto& id : absl::StrSplit(s.Text(8), ',', absl::SkipEmpty())) {
    r.add_worker_ids(std::string(id));
  }
  r.set_resolved_config_yaml(s.Text(9));
  const std::string data = s.Blob(10);
  if (!data.empty() && !r.mutable_data()->ParseFromString(data)) r.clear_data();
  const std::string resolved = s.Blob(11);
  if (!resolved.empty() && !r.mutable_resolved_target()->ParseFromString(resolved)) {
    r.clear_resolved_target();
  }
  return r;
}

constexpr const char* kRunColumns =
    "run_id, name, state, message, step, total_steps, created_ms, updated_ms, worker_ids, "
    "resolved_yaml, data_summary, resolved_target";

}  // namespace

absl::StatusOr<std::unique_ptr<RunStore>> RunStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open run store ", path, ": ", msg));
  }
  std::unique_ptr<RunStore> store(new RunStore(db));
  sqlite3_busy_timeout(db, 5000);
  if (path != ":memory:") RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL;"));
  // FULL: a committed transition survives power loss, not only a process crash.
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL;"));
  RETURN_IF_ERROR(store->Exec(kSchema));
  RETURN_IF_ERROR(store->Migrate());
  return store;
}

RunStore::~RunStore() { sqlite3_close(db_); }

absl::Status RunStore::Migrate() {
  // Stores written before a column existed get it added (SQLite has no ADD COLUMN IF NOT EXISTS).
  for (const char* column : {"data_summary", "resolved_target"}) {
    Stmt info(db_, "SELECT COUNT(*) FROM pragma_table_info('runs') WHERE name = ?1");
    RETURN_IF_ERROR(info.status());
    info.Bind(1, std::string(column));
    ASSIGN_OR_RETURN(bool row, info.Step());
    if (row && info.Int(0) == 0) {
      RETURN_IF_ERROR(Exec(
          absl::StrCat("ALTER TABLE runs ADD COLUMN ", column, " BLOB NOT NULL DEFAULT x'';")));
    }
  }
  return absl::OkStatus();
}

absl::Status RunStore::SetResolvedTarget(const std::string& run_id,
                                         const v1::ResolvedTarget& resolved) {
  Stmt up(db_, "UPDATE runs SET resolved_target = ?2 WHERE run_id = ?1");
  RETURN_IF_ERROR(up.status());
  up.Bind(1, run_id).BindBlob(2, resolved.SerializeAsString());
  return up.Step().status();
}

absl::Status RunStore::SetQueuedMessage(const std::string& run_id, const std::string& message) {
  Stmt up(db_, "UPDATE runs SET message = ?2 WHERE run_id = ?1 AND state = ?3");
  RETURN_IF_ERROR(up.status());
  up.Bind(1, run_id).Bind(2, message).Bind(3, int64_t{v1::RUN_STATE_QUEUED});
  return up.Step().status();
}

absl::Status RunStore::InTransaction(const std::function<absl::Status()>& body) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  absl::Status s = body();
  if (!s.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return s;
  }
  return Exec("COMMIT;");
}

absl::Status RunStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("sqlite: ", msg));
  }
  return absl::OkStatus();
}

absl::Status RunStore::CreateRun(const v1::RunStatus& run, const std::string& source_yaml,
                                 int64_t now_ms) {
  return InTransaction([&]() -> absl::Status {
    Stmt ins(db_,
             "INSERT INTO runs (run_id, name, state, message, created_ms, updated_ms, "
             "resolved_yaml, source_yaml, total_steps, data_summary, resolved_target) "
             "VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?8, ?9, ?10)");
    RETURN_IF_ERROR(ins.status());
    ins.Bind(1, run.run_id()).Bind(2, run.name()).Bind(3, int64_t{v1::RUN_STATE_QUEUED});
    ins.Bind(4, run.message()).Bind(5, now_ms).Bind(6, run.resolved_config_yaml());
    ins.Bind(7, source_yaml).Bind(8, run.total_steps());
    ins.BindBlob(9, run.has_data() ? run.data().SerializeAsString() : std::string());
    ins.BindBlob(
        10, run.has_resolved_target() ? run.resolved_target().SerializeAsString() : std::string());
    RETURN_IF_ERROR(ins.Step().status());
    Stmt ev(db_,
            "INSERT INTO run_events (run_id, seq, unix_ms, from_state, to_state, message, step) "
            "VALUES (?1, 1, ?2, ?3, ?4, ?5, 0)");
    RETURN_IF_ERROR(ev.status());
    ev.Bind(1, run.run_id()).Bind(2, now_ms).Bind(3, int64_t{v1::RUN_STATE_UNSPECIFIED});
    ev.Bind(4, int64_t{v1::RUN_STATE_QUEUED}).Bind(5, run.message());
    return ev.Step().status();
  });
}

absl::StatusOr<v1::RunEvent> RunStore::Transition(const std::string& run_id, v1::RunState from,
                                                  v1::RunState to, const std::string& message,
                                                  int64_t now_ms,
                                                  const std::vector<std::string>* worker_ids) {
  if (!IsAllowedTransition(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run ", run_id, ": transition ", StateName(from), " -> ", StateName(to), " not allowed"));
  }
  v1::RunEvent event;
  RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    Stmt cur(db_,
             "SELECT state, step, (SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE run_id = "
             "?1) FROM runs WHERE run_id = ?1");
    RETURN_IF_ERROR(cur.status());
    cur.Bind(1, run_id);
    ASSIGN_OR_RETURN(bool found, cur.Step());
    if (!found) return absl::NotFoundError(absl::StrCat("run ", run_id, " not found"));
    auto state = static_cast<v1::RunState>(cur.Int(0));
    if (state != from) {
      return absl::FailedPreconditionError(
          absl::StrCat("run ", run_id, " is ", StateName(state), ", not ", StateName(from)));
    }
    event.set_seq(cur.Int(2) + 1);
    event.set_run_id(run_id);
    event.set_unix_ms(now_ms);
    event.set_from_state(from);
    event.set_to_state(to);
    event.set_message(message);
    event.set_step(cur.Int(1));
    Stmt up(db_, "UPDATE runs SET state = ?2, message = ?3, updated_ms = ?4 WHERE run_id = ?1");
    RETURN_IF_ERROR(up.status());
    up.Bind(1, run_id).Bind(2, int64_t{to}).Bind(3, message).Bind(4, now_ms);
    RETURN_IF_ERROR(up.Step().status());
    if (worker_ids != nullptr) {
      Stmt workers(db_, "UPDATE runs SET worker_ids = ?2 WHERE run_id = ?1");
      RETURN_IF_ERROR(workers.status());
      workers.Bind(1, run_id).Bind(2, absl::StrJoin(*worker_ids, ","));
      RETURN_IF_ERROR(workers.Step().status());
    }
    Stmt ev(db_,
            "INSERT INTO run_events (run_id, seq, unix_ms, from_state, to_state, message, step) "
            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    RETURN_IF_ERROR(ev.status());
    ev.Bind(1, run_id).Bind(2, event.seq()).Bind(3, now_ms).Bind(4, int64_t{from});
    ev.Bind(5, int64_t{to}).Bind(6, message).Bind(7, event.step());
    return ev.Step().status();
  }));
  return event;
}

absl::StatusOr<v1::RunStatus> RunStore::GetRun(const std::string& run_id) {
  Stmt s(db_, absl::StrCat("SELECT ", kRunColumns, " FROM runs WHERE run_id = ?1").c_str());
  RETURN_IF_ERROR(s.status());
  s.Bind(1, run_id);
  ASSIGN_OR_RETURN(bool found, s.Step());
  if (!found) return absl::NotFoundError(absl::StrCat("run ", run_id, " not found"));
  return RowToRun(s);
}

absl::StatusOr<std::vector<v1::RunStatus>> RunStore::ListRuns() {
  Stmt s(db_,
         absl::StrCat("SELECT ", kRunColumns, " FROM runs ORDER BY created_ms, run_id").c_str());
  RETURN_IF_ERROR(s.status());
  std::vector<v1::RunStatus> runs;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    runs.push_back(RowToRun(s));
  }
  return runs;
}

absl::StatusOr<std::vector<v1::RunEvent>> RunStore::EventsAfter(const std::string& run_id,
                                                                int64_t after_seq) {
  Stmt s(db_,
         "SELECT seq, unix_ms, from_state, to_state, message, step FROM run_events "
         "WHERE run_id = ?1 AND seq > ?2 ORDER BY seq");
  RETURN_IF_ERROR(s.status());
  s.Bind(1, run_id).Bind(2, after_seq);
  std::vector<v1::RunEvent> events;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    v1::RunEvent e;
    e.set_seq(s.Int(0));
    e.set_run_id(run_id);
    e.set_unix_ms(s.Int(1));
    e.set_from_state(static_cast<v1::RunState>(s.Int(2)));
    e.set_to_state(static_cast<v1::RunState>(s.Int(3)));
    e.set_message(s.Text(4));
    e.set_step(s.Int(5));
    events.push_back(std::move(e));
  }
  return events;
}

absl::StatusOr<bool> RunStore::CommitStep(const std::string& run_id, int64_t step,
                                          const std::string& cursor, const std::string& metrics,
                                          int64_t now_ms) {
  bool inserted = false;
  RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    Stmt cur(db_, "SELECT state, step FROM runs WHERE run_id = ?1");
    RETURN_IF_ERROR(cur.status());
    cur.Bind(1, run_id);
    ASSIGN_OR_RETURN(bool found, cur.Step());
    if (!found) return absl::NotFoundError(absl::StrCat("run ", run_id, " not found"));
    const auto state = static_cast<v1::RunState>(cur.Int(0));
    const int64_t next = cur.Int(1);  // steps committed so far = the next step to commit
    if (step < next) {                // a retried commit: accepted only if it is the same step
      Stmt old(db_, "SELECT cursor FROM run_steps WHERE run_id = ?1 AND step = ?2");
      RETURN_IF_ERROR(old.status());
      old.Bind(1, run_id).Bind(2, step);
      ASSIGN_OR_RETURN(bool have, old.Step());
      if (have && old.Text(0) == cursor) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          "run ", run_id, ": step ", step, " is already committed with another data cursor"));
    }
    if (step > next) {
      return absl::FailedPreconditionError(
          absl::StrCat("run ", run_id, ": step ", step, " committed before step ", next));
    }
    if (state != v1::RUN_STATE_RUNNING) {
      return absl::FailedPreconditionError(
          absl::StrCat("run ", run_id, " is ", StateName(state), ", not running"));
    }
    Stmt ins(db_,
             "INSERT INTO run_steps (run_id, step, cursor, metrics, unix_ms) "
             "VALUES (?1, ?2, ?3, ?4, ?5)");
    RETURN_IF_ERROR(ins.status());
    ins.Bind(1, run_id).Bind(2, step).Bind(3, cursor).Bind(4, metrics).Bind(5, now_ms);
    RETURN_IF_ERROR(ins.Step().status());
    Stmt up(db_, "UPDATE runs SET step = ?2, updated_ms = ?3 WHERE run_id = ?1");
    RETURN_IF_ERROR(up.status());
    up.Bind(1, run_id).Bind(2, step + 1).Bind(3, now_ms);
    RETURN_IF_ERROR(up.Step().status());
    inserted = true;
    return absl::OkStatus();
  }));
  return inserted;
}

absl::StatusOr<std::optional<CommittedStep>> RunStore::LastCommittedStep(
    const std::string& run_id) {
  Stmt s(db_,
         "SELECT step, cursor, metrics, unix_ms FROM run_steps WHERE run_id = ?1 "
         "ORDER BY step DESC LIMIT 1");
  RETURN_IF_ERROR(s.status());
  s.Bind(1, run_id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<CommittedStep>();
  CommittedStep c;
  c.step = s.Int(0);
  c.cursor = s.Text(1);
  c.metrics = s.Text(2);
  c.unix_ms = s.Int(3);
  return std::optional<CommittedStep>(std::move(c));
}

}  // namespace dflash::coordinator

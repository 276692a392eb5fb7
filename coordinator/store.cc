#include "coordinator/store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/sqlite.h"
#include "google/protobuf/message_lite.h"
#include "services/common/status_macros.h"

namespace stagewise::coordinator {
namespace {

using sql::Exec;
using sql::SqliteError;
using sql::Stmt;
using sql::WriteTxn;

// Schema migrations: kMigrations[i] takes PRAGMA user_version i to i + 1.
// Append new entries; never edit a released one.
constexpr const char* kMigrations[] = {
    // 0 -> 1: initial schema. `status` is a serialized v1::JobStatus; `state`
    // and the timestamps are copied out of it so they can be queried.
    R"sql(
CREATE TABLE jobs (
  job_id     TEXT PRIMARY KEY NOT NULL,
  name       TEXT NOT NULL,
  state      INTEGER NOT NULL,
  spec_yaml  TEXT NOT NULL,
  status     BLOB NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL
);
CREATE INDEX jobs_by_state ON jobs(state);
CREATE TABLE transitions (
  id         INTEGER PRIMARY KEY,
  job_id     TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
  from_state INTEGER NOT NULL,
  to_state   INTEGER NOT NULL,
  reason     TEXT NOT NULL,
  unix_ms    INTEGER NOT NULL
);
CREATE INDEX transitions_by_job ON transitions(job_id);
CREATE TABLE metrics (
  id      INTEGER PRIMARY KEY,
  job_id  TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
  step    INTEGER NOT NULL,
  name    TEXT NOT NULL,
  value   REAL,  -- NULL is NaN: SQLite stores a bound NaN as NULL
  unix_ms INTEGER NOT NULL
);
CREATE INDEX metrics_by_job_name ON metrics(job_id, name);
)sql",
    // 1 -> 2: pipeline timelines. `chunk` is a serialized v1::TraceChunk as a
    // stage sent it (spans on the worker's clock, with its offset).
    R"sql(
CREATE TABLE traces (
  id      INTEGER PRIMARY KEY,
  job_id  TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
  stage   INTEGER NOT NULL,
  spans   INTEGER NOT NULL,
  chunk   BLOB NOT NULL
);
CREATE INDEX traces_by_job ON traces(job_id);
)sql",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == JobStore::kSchemaVersion,
              "one migration per schema version");

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::string StateName(v1::JobState state) {
  if (v1::JobState_IsValid(state)) return v1::JobState_Name(state);
  return absl::StrCat("JobState(", static_cast<int>(state), ")");
}

absl::StatusOr<std::string> Serialize(const v1::JobStatus& status, absl::string_view op) {
  std::string bytes;
  if (!status.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat(op, ": cannot serialize JobStatus"));
  }
  return bytes;
}

absl::Status CorruptStatus(absl::string_view op, absl::string_view job_id) {
  return absl::DataLossError(
      absl::StrCat(op, ": stored status of job '", job_id, "' is not a valid JobStatus"));
}

absl::Status JobNotFound(absl::string_view job_id) {
  return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
}

absl::Status CheckJobId(absl::string_view job_id, absl::string_view field) {
  if (job_id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  return absl::OkStatus();
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

bool IsAllowedTransition(v1::JobState from, v1::JobState to) {
  if (!v1::JobState_IsValid(from) || !v1::JobState_IsValid(to)) return false;
  if (from == v1::JOB_STATE_UNSPECIFIED || to == v1::JOB_STATE_UNSPECIFIED) return false;
  if (IsTerminal(from) || from == to) return false;
  // Any live job can fail or be cancelled.
  if (to == v1::FAILED || to == v1::CANCELLED) return true;
  switch (from) {
    case v1::PENDING:
      return to == v1::PROFILING || to == v1::CONFIGURING;
    case v1::PROFILING:
      return to == v1::CONFIGURING || to == v1::PENDING;
    case v1::CONFIGURING:
      return to == v1::RUNNING || to == v1::PENDING || to == v1::RECOVERING;
    case v1::RUNNING:
      return to == v1::CHECKPOINTING || to == v1::SUCCEEDED || to == v1::RECOVERING;
    case v1::CHECKPOINTING:
      return to == v1::RUNNING || to == v1::RECOVERING;
    case v1::RECOVERING:
      return to == v1::CONFIGURING || to == v1::PROFILING;
    default:
      return false;
  }
}

struct JobStore::Impl {
  explicit Impl(sqlite3* connection) : db(connection) {}
  ~Impl() {
    absl::MutexLock lock(&mu);
    // _v2 closes even with (leaked) unfinalized statements; on the last
    // close SQLite checkpoints the WAL into the main file.
    sqlite3_close_v2(db);
  }

  // Reads one job row inside the caller's transaction (or alone).
  struct Row {
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    v1::JobStatus status;
    std::string spec_yaml;
  };
  absl::StatusOr<Row> ReadJob(absl::string_view job_id, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Stmt select(db, op);
    STAGEWISE_RETURN_IF_ERROR(select.Prepare(
        "SELECT state, status, spec_yaml, created_ms, updated_ms FROM jobs WHERE job_id = ?1"));
    select.BindText(1, job_id);
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
    if (!row) return JobNotFound(job_id);
    Row out;
    out.state = static_cast<v1::JobState>(select.Int64(0));
    if (!select.ParseProto(1, &out.status)) return CorruptStatus(op, job_id);
    out.spec_yaml = select.Text(2);
    // The columns are authoritative; the blob carries the rest.
    out.status.set_state(out.state);
    out.status.set_created_unix_ms(select.Int64(3));
    out.status.set_updated_unix_ms(select.Int64(4));
    return out;
  }

  absl::StatusOr<bool> JobExists(absl::string_view job_id, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Stmt select(db, op);
    STAGEWISE_RETURN_IF_ERROR(select.Prepare("SELECT 1 FROM jobs WHERE job_id = ?1"));
    select.BindText(1, job_id);
    return select.Step();
  }

  // Writes state, status blob and timestamps of an existing job.
  absl::Status WriteStatus(const v1::JobStatus& status, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    STAGEWISE_ASSIGN_OR_RETURN(std::string bytes, Serialize(status, op));
    Stmt update(db, op);
    STAGEWISE_RETURN_IF_ERROR(update.Prepare(
        "UPDATE jobs SET name = ?2, state = ?3, status = ?4, updated_ms = ?5 WHERE job_id = ?1"));
    update.BindText(1, status.job_id());
    update.BindText(2, status.name());
    update.BindInt64(3, status.state());
    update.BindBlob(4, bytes);
    update.BindInt64(5, status.updated_unix_ms());
    return update.Run();
  }

  absl::Mutex mu;
  sqlite3* db ABSL_GUARDED_BY(mu);
  absl::BitGen bitgen ABSL_GUARDED_BY(mu);
};

namespace {

// Brings the schema to kSchemaVersion, one migration per transaction.
absl::Status Migrate(sqlite3* db) {
  constexpr absl::string_view kOp = "JobStore::Open (migrate schema)";
  for (;;) {
    WriteTxn txn(db, kOp);
    STAGEWISE_RETURN_IF_ERROR(txn.Begin());
    // Read inside the write transaction: another process may have migrated
    // the file since we looked.
    Stmt query(db, kOp);
    STAGEWISE_RETURN_IF_ERROR(query.Prepare("PRAGMA user_version"));
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, query.Step());
    const int64_t version = row ? query.Int64(0) : 0;
    if (version == JobStore::kSchemaVersion) return txn.Commit();
    if (version < 0 || version > JobStore::kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "database schema version ", version,
          " is not supported by this binary (newest known: ", JobStore::kSchemaVersion, ")"));
    }
    STAGEWISE_RETURN_IF_ERROR(Exec(db, kMigrations[version], kOp));
    // The version is our own integer, not user data; PRAGMA takes no binds.
    const std::string set_version = absl::StrCat("PRAGMA user_version = ", version + 1);
    STAGEWISE_RETURN_IF_ERROR(Exec(db, set_version.c_str(), kOp));
    STAGEWISE_RETURN_IF_ERROR(txn.Commit());
  }
}

absl::Status Configure(sqlite3* db, const JobStoreOptions& options) {
  sqlite3_extended_result_codes(db, 1);
  const int64_t busy_ms = absl::ToInt64Milliseconds(options.busy_timeout);
  const int rc = sqlite3_busy_timeout(
      db, static_cast<int>(
              std::min<int64_t>(std::max<int64_t>(busy_ms, 0), std::numeric_limits<int>::max())));
  if (rc != SQLITE_OK) return SqliteError(db, rc, "JobStore::Open (busy_timeout)");
  if (sqlite3_db_readonly(db, "main") == 1) {
    return absl::PermissionDeniedError("JobStore::Open: database is read-only");
  }

  // WAL: readers (ListJobs, the CLI) never block the writer, and a commit is
  // one sequential append. An in-memory database reports "memory" instead.
  {
    Stmt wal(db, "JobStore::Open (journal_mode=WAL)");
    STAGEWISE_RETURN_IF_ERROR(wal.Prepare("PRAGMA journal_mode = WAL"));
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, wal.Step());
    const std::string mode = row ? wal.Text(0) : std::string();
    if (mode != "wal" && mode != "memory") {
      return absl::FailedPreconditionError(
          absl::StrCat("JobStore::Open: cannot enable WAL (journal_mode is '", mode, "')"));
    }
  }
  // FULL, not NORMAL: in WAL mode NORMAL may lose the last commits on power
  // loss. The coordinator acts on a transition (starts workers, reports
  // SUCCEEDED) right after Transition() returns, so a committed transition
  // must be on disk by then. Commits are rare (transitions, batched metrics),
  // so the extra fsync per commit is cheap.
  STAGEWISE_RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous = FULL", "JobStore::Open (synchronous)"));
  // Per connection, and must be set outside a transaction.
  STAGEWISE_RETURN_IF_ERROR(Exec(db, "PRAGMA foreign_keys = ON", "JobStore::Open (foreign_keys)"));
  return Migrate(db);
}

}  // namespace

JobStore::JobStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobStore::~JobStore() = default;

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  return Open(path, JobStoreOptions());
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path,
                                                         const JobStoreOptions& options) {
  // SQLite would silently make a private temporary database of "".
  if (path.empty()) return absl::InvalidArgumentError("JobStore::Open: path is empty");
  sqlite3* db = nullptr;
  // NOMUTEX: the connection is only used under Impl::mu.
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  // From here `impl` owns (and closes) the handle, which SQLite allocates
  // even when the open fails.
  auto impl = std::make_unique<Impl>(db);
  if (rc != SQLITE_OK) {
    const absl::Status s = SqliteError(db, rc, "JobStore::Open");
    return absl::Status(s.code(),
                        absl::StrCat("cannot open job store '", path, "': ", s.message()));
  }
  absl::Status configured;
  {
    absl::MutexLock lock(&impl->mu);
    configured = Configure(impl->db, options);
  }
  if (!configured.ok()) {
    return absl::Status(configured.code(),
                        absl::StrCat("cannot open job store '", path, "': ", configured.message()));
  }
  return std::unique_ptr<JobStore>(new JobStore(std::move(impl)));
}

absl::Status JobStore::CreateJob(const JobRecord& record) {
  constexpr absl::string_view kOp = "JobStore::CreateJob";
  STAGEWISE_RETURN_IF_ERROR(CheckJobId(record.status.job_id(), "status.job_id"));
  v1::JobStatus status = record.status;
  status.set_state(v1::PENDING);
  const int64_t now = NowMs();
  if (status.created_unix_ms() == 0) status.set_created_unix_ms(now);
  if (status.updated_unix_ms() == 0) status.set_updated_unix_ms(now);
  STAGEWISE_ASSIGN_OR_RETURN(std::string bytes, Serialize(status, kOp));

  absl::MutexLock lock(&impl_->mu);
  Stmt insert(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      insert.Prepare("INSERT INTO jobs (job_id, name, state, spec_yaml, status, created_ms, "
                     "updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
  insert.BindText(1, status.job_id());
  insert.BindText(2, status.name());
  insert.BindInt64(3, status.state());
  insert.BindText(4, record.spec_yaml);
  insert.BindBlob(5, bytes);
  insert.BindInt64(6, status.created_unix_ms());
  insert.BindInt64(7, status.updated_unix_ms());
  absl::Status inserted = insert.Run();
  if (!inserted.ok() && sqlite3_extended_errcode(impl_->db) == SQLITE_CONSTRAINT_PRIMARYKEY) {
    return absl::AlreadyExistsError(absl::StrCat("job '", status.job_id(), "' already exists"));
  }
  return inserted;
}

absl::Status JobStore::UpdateStatus(const v1::JobStatus& status) {
  constexpr absl::string_view kOp = "JobStore::UpdateStatus";
  STAGEWISE_RETURN_IF_ERROR(CheckJobId(status.job_id(), "status.job_id"));

  absl::MutexLock lock(&impl_->mu);
  WriteTxn txn(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(txn.Begin());
  STAGEWISE_ASSIGN_OR_RETURN(Impl::Row current, impl_->ReadJob(status.job_id(), kOp));
  if (status.state() != v1::JOB_STATE_UNSPECIFIED && status.state() != current.state) {
    return absl::InvalidArgumentError(absl::StrCat(
        "status.state: UpdateStatus cannot move job '", status.job_id(), "' from ",
        StateName(current.state), " to ", StateName(status.state()), "; use Transition"));
  }
  v1::JobStatus updated = status;
  updated.set_state(current.state);
  updated.set_created_unix_ms(current.status.created_unix_ms());
  updated.set_updated_unix_ms(NowMs());
  STAGEWISE_RETURN_IF_ERROR(impl_->WriteStatus(updated, kOp));
  return txn.Commit();
}

absl::Status JobStore::WriteProgress(const ProgressBatch& batch) {
  constexpr absl::string_view kOp = "JobStore::WriteProgress";
  if (batch.statuses.empty() && batch.points.empty() && batch.notes.empty()) {
    return absl::OkStatus();
  }
  for (const v1::JobStatus& status : batch.statuses) {
    STAGEWISE_RETURN_IF_ERROR(CheckJobId(status.job_id(), "statuses[].job_id"));
  }
  for (size_t i = 0; i < batch.points.size(); ++i) {
    STAGEWISE_RETURN_IF_ERROR(CheckJobId(batch.points[i].first, "points[].first"));
    if (batch.points[i].second.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("points[", i, "].name is empty"));
    }
  }
  for (size_t i = 0; i < batch.notes.size(); ++i) {
    STAGEWISE_RETURN_IF_ERROR(CheckJobId(batch.notes[i].first, "notes[].first"));
    if (batch.notes[i].second.from != batch.notes[i].second.to) {
      return absl::InvalidArgumentError(
          absl::StrCat("notes[", i, "]: a note stays in its state; use Transition"));
    }
  }
  const int64_t now = NowMs();

  absl::MutexLock lock(&impl_->mu);
  // One transaction for the batch: one fsync, and all-or-nothing.
  WriteTxn txn(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(txn.Begin());
  for (const v1::JobStatus& status : batch.statuses) {
    STAGEWISE_ASSIGN_OR_RETURN(Impl::Row current, impl_->ReadJob(status.job_id(), kOp));
    if (status.state() != v1::JOB_STATE_UNSPECIFIED && status.state() != current.state) {
      return absl::InvalidArgumentError(absl::StrCat(
          "statuses[].state: WriteProgress cannot move job '", status.job_id(), "' from ",
          StateName(current.state), " to ", StateName(status.state()), "; use Transition"));
    }
    v1::JobStatus updated = status;
    updated.set_state(current.state);
    updated.set_created_unix_ms(current.status.created_unix_ms());
    updated.set_updated_unix_ms(now);
    STAGEWISE_RETURN_IF_ERROR(impl_->WriteStatus(updated, kOp));
  }
  if (!batch.notes.empty()) {
    Stmt note(impl_->db, kOp);
    STAGEWISE_RETURN_IF_ERROR(
        note.Prepare("INSERT INTO transitions (job_id, from_state, to_state, reason, unix_ms) "
                     "VALUES (?1, ?2, ?2, ?3, ?4)"));
    for (const auto& [job_id, n] : batch.notes) {
      STAGEWISE_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id, kOp));
      if (!exists) return JobNotFound(job_id);
      note.Reset();
      note.BindText(1, job_id);
      note.BindInt64(2, n.to);
      note.BindText(3, n.reason);
      note.BindInt64(4, n.unix_ms != 0 ? n.unix_ms : now);
      STAGEWISE_RETURN_IF_ERROR(note.Run());
    }
  }
  if (batch.points.empty()) return txn.Commit();
  Stmt insert(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(insert.Prepare(
      "INSERT INTO metrics (job_id, step, name, value, unix_ms) VALUES (?1, ?2, ?3, ?4, ?5)"));
  std::string checked;  // the last job id known to exist (points come grouped by job)
  for (const auto& [job_id, point] : batch.points) {
    if (job_id != checked) {
      STAGEWISE_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id, kOp));
      if (!exists) return JobNotFound(job_id);
      checked = job_id;
    }
    insert.Reset();
    insert.BindText(1, job_id);
    insert.BindInt64(2, point.step);
    insert.BindText(3, point.name);
    insert.BindDouble(4, point.value);
    insert.BindInt64(5, point.unix_ms != 0 ? point.unix_ms : now);
    STAGEWISE_RETURN_IF_ERROR(insert.Run());
  }
  return txn.Commit();
}

absl::StatusOr<v1::JobStatus> JobStore::Transition(const std::string& job_id, v1::JobState to,
                                                   const std::string& reason) {
  constexpr absl::string_view kOp = "JobStore::Transition";
  STAGEWISE_RETURN_IF_ERROR(CheckJobId(job_id, "job_id"));
  if (!v1::JobState_IsValid(to) || to == v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat("to: not a job state: ", StateName(to)));
  }

  absl::MutexLock lock(&impl_->mu);
  WriteTxn txn(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(txn.Begin());
  STAGEWISE_ASSIGN_OR_RETURN(Impl::Row current, impl_->ReadJob(job_id, kOp));
  const v1::JobState from = current.state;
  if (!IsAllowedTransition(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "': transition ",
                                                      StateName(from), " -> ", StateName(to),
                                                      " is not allowed"));
  }
  const int64_t now = NowMs();
  v1::JobStatus status = std::move(current.status);
  status.set_state(to);
  status.set_reason(reason);
  status.set_updated_unix_ms(now);
  STAGEWISE_RETURN_IF_ERROR(impl_->WriteStatus(status, kOp));

  Stmt log(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      log.Prepare("INSERT INTO transitions (job_id, from_state, to_state, reason, unix_ms) "
                  "VALUES (?1, ?2, ?3, ?4, ?5)"));
  log.BindText(1, job_id);
  log.BindInt64(2, from);
  log.BindInt64(3, to);
  log.BindText(4, reason);
  log.BindInt64(5, now);
  STAGEWISE_RETURN_IF_ERROR(log.Run());
  STAGEWISE_RETURN_IF_ERROR(txn.Commit());
  return status;
}

absl::Status JobStore::Backup(const std::string& path) const {
  constexpr absl::string_view kOp = "JobStore::Backup";
  if (std::filesystem::exists(path)) {
    return absl::AlreadyExistsError(absl::StrCat(kOp, ": ", path, " exists"));
  }
  sqlite3* out = nullptr;
  auto fail = [&](const std::string& why) {
    if (out != nullptr) sqlite3_close_v2(out);
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return absl::UnavailableError(absl::StrCat(kOp, ": ", path, ": ", why));
  };
  if (sqlite3_open_v2(path.c_str(), &out, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    return fail(out != nullptr ? sqlite3_errmsg(out) : "cannot open");
  }
  sqlite3_backup* backup = nullptr;
  {
    absl::MutexLock lock(&impl_->mu);
    backup = sqlite3_backup_init(out, "main", impl_->db, "main");
  }
  if (backup == nullptr) return fail(sqlite3_errmsg(out));
  int rc = SQLITE_OK;
  do {
    {
      // The store's connection is shared: one step at a time under its lock;
      // its own writes between steps reach the copy (SQLite updates a backup
      // from the connection it reads).
      absl::MutexLock lock(&impl_->mu);
      rc = sqlite3_backup_step(backup, 256);
    }
    if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) absl::SleepFor(absl::Milliseconds(5));
  } while (rc == SQLITE_OK || rc == SQLITE_BUSY || rc == SQLITE_LOCKED);
  {
    absl::MutexLock lock(&impl_->mu);
    sqlite3_backup_finish(backup);
  }
  if (rc != SQLITE_DONE) return fail(sqlite3_errstr(rc));
  if (sqlite3_close_v2(out) != SQLITE_OK) {
    out = nullptr;
    return fail("closing the copy failed");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> JobStore::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&impl_->mu);
  STAGEWISE_ASSIGN_OR_RETURN(Impl::Row row, impl_->ReadJob(job_id, "JobStore::GetJob"));
  JobRecord record;
  record.status = std::move(row.status);
  record.spec_yaml = std::move(row.spec_yaml);
  return record;
}

absl::StatusOr<std::vector<v1::JobStatus>> JobStore::ListJobs(int limit) const {
  constexpr absl::string_view kOp = "JobStore::ListJobs";
  absl::MutexLock lock(&impl_->mu);
  Stmt select(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      select.Prepare("SELECT job_id, state, status, created_ms, updated_ms FROM jobs ORDER BY "
                     "created_ms DESC, rowid DESC LIMIT ?1"));
  select.BindInt64(1, limit > 0 ? limit : -1);  // a negative LIMIT means none
  std::vector<v1::JobStatus> jobs;
  for (;;) {
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
    if (!row) break;
    v1::JobStatus& status = jobs.emplace_back();
    if (!select.ParseProto(2, &status)) return CorruptStatus(kOp, select.Text(0));
    status.set_state(static_cast<v1::JobState>(select.Int64(1)));
    status.set_created_unix_ms(select.Int64(3));
    status.set_updated_unix_ms(select.Int64(4));
  }
  return jobs;
}

absl::StatusOr<JobStore::JobPage> JobStore::ListJobsPage(int page_size,
                                                         const std::string& page_token,
                                                         size_t max_bytes) const {
  constexpr absl::string_view kOp = "JobStore::ListJobsPage";
  // A token is "<created_ms>.<rowid>" of the last job of the page before.
  int64_t after_created = 0;
  int64_t after_rowid = 0;
  if (!page_token.empty()) {
    std::vector<absl::string_view> parts = absl::StrSplit(page_token, '.');
    if (page_token.size() > 64 || parts.size() != 2 ||
        !absl::SimpleAtoi(parts[0], &after_created) || !absl::SimpleAtoi(parts[1], &after_rowid)) {
      return absl::InvalidArgumentError(
          "page_token: not a token this coordinator issued (give "
          "ListJobsResponse.next_page_token)");
    }
  }
  page_size = std::max(page_size, 1);
  absl::MutexLock lock(&impl_->mu);
  Stmt select(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(select.Prepare(
      "SELECT job_id, state, status, created_ms, updated_ms, rowid FROM jobs WHERE ?1 = 0 OR "
      "created_ms < ?2 OR (created_ms = ?2 AND rowid < ?3) ORDER BY created_ms DESC, rowid DESC "
      "LIMIT ?4"));
  select.BindInt64(1, page_token.empty() ? 0 : 1);
  select.BindInt64(2, after_created);
  select.BindInt64(3, after_rowid);
  select.BindInt64(4, int64_t{page_size} + 1);  // one more: is there a next page?
  JobPage page;
  size_t bytes = 0;
  std::string last;
  for (;;) {
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
    if (!row) break;
    v1::JobStatus status;
    if (!select.ParseProto(2, &status)) return CorruptStatus(kOp, select.Text(0));
    status.set_state(static_cast<v1::JobState>(select.Int64(1)));
    status.set_created_unix_ms(select.Int64(3));
    status.set_updated_unix_ms(select.Int64(4));
    const size_t size = status.ByteSizeLong();
    if (static_cast<int>(page.jobs.size()) == page_size ||
        (!page.jobs.empty() && bytes + size > max_bytes)) {
      page.next_page_token = last;  // this row starts the next page
      break;
    }
    bytes += size;
    last = absl::StrCat(select.Int64(3), ".", select.Int64(5));
    page.jobs.push_back(std::move(status));
  }
  return page;
}

absl::StatusOr<std::vector<JobRecord>> JobStore::UnfinishedJobs() const {
  constexpr absl::string_view kOp = "JobStore::UnfinishedJobs";
  absl::MutexLock lock(&impl_->mu);
  Stmt select(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      select.Prepare("SELECT job_id, state, status, spec_yaml, created_ms, updated_ms FROM jobs "
                     "WHERE state NOT IN (?1, ?2, ?3) ORDER BY created_ms ASC, rowid ASC"));
  select.BindInt64(1, v1::SUCCEEDED);
  select.BindInt64(2, v1::FAILED);
  select.BindInt64(3, v1::CANCELLED);
  std::vector<JobRecord> jobs;
  for (;;) {
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
    if (!row) break;
    JobRecord& record = jobs.emplace_back();
    if (!select.ParseProto(2, &record.status)) return CorruptStatus(kOp, select.Text(0));
    record.status.set_state(static_cast<v1::JobState>(select.Int64(1)));
    record.spec_yaml = select.Text(3);
    record.status.set_created_unix_ms(select.Int64(4));
    record.status.set_updated_unix_ms(select.Int64(5));
  }
  return jobs;
}

absl::StatusOr<std::vector<TransitionRecord>> JobStore::Transitions(const std::string& job_id,
                                                                    bool notes) const {
  constexpr absl::string_view kOp = "JobStore::Transitions";
  absl::MutexLock lock(&impl_->mu);
  STAGEWISE_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id, kOp));
  if (!exists) return JobNotFound(job_id);
  Stmt select(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      // Notes are written with the batched progress, after transitions that
      // happened later: by time, then as written.
      select.Prepare(notes ? "SELECT from_state, to_state, reason, unix_ms FROM transitions "
                             "WHERE job_id = ?1 ORDER BY unix_ms, id"
                           : "SELECT from_state, to_state, reason, unix_ms FROM transitions "
                             "WHERE job_id = ?1 AND from_state != to_state ORDER BY id"));
  select.BindText(1, job_id);
  std::vector<TransitionRecord> transitions;
  for (;;) {
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
    if (!row) break;
    TransitionRecord& t = transitions.emplace_back();
    t.from = static_cast<v1::JobState>(select.Int64(0));
    t.to = static_cast<v1::JobState>(select.Int64(1));
    t.reason = select.Text(2);
    t.unix_ms = select.Int64(3);
  }
  return transitions;
}

absl::Status JobStore::AppendMetrics(const std::string& job_id,
                                     const std::vector<MetricPoint>& points) {
  constexpr absl::string_view kOp = "JobStore::AppendMetrics";
  STAGEWISE_RETURN_IF_ERROR(CheckJobId(job_id, "job_id"));
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("points[", i, "].name is empty"));
    }
  }
  const int64_t now = NowMs();

  absl::MutexLock lock(&impl_->mu);
  // One transaction for the batch: one fsync, and all-or-nothing.
  WriteTxn txn(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(txn.Begin());
  STAGEWISE_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id, kOp));
  if (!exists) return JobNotFound(job_id);
  Stmt insert(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(insert.Prepare(
      "INSERT INTO metrics (job_id, step, name, value, unix_ms) VALUES (?1, ?2, ?3, ?4, ?5)"));
  for (const MetricPoint& point : points) {
    insert.Reset();
    insert.BindText(1, job_id);
    insert.BindInt64(2, point.step);
    insert.BindText(3, point.name);
    insert.BindDouble(4, point.value);
    insert.BindInt64(5, point.unix_ms != 0 ? point.unix_ms : now);
    STAGEWISE_RETURN_IF_ERROR(insert.Run());
  }
  return txn.Commit();
}

absl::StatusOr<std::vector<MetricPoint>> JobStore::Metrics(const std::string& job_id,
                                                           const std::string& name) const {
  constexpr absl::string_view kOp = "JobStore::Metrics";
  absl::MutexLock lock(&impl_->mu);
  STAGEWISE_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id, kOp));
  if (!exists) return JobNotFound(job_id);
  Stmt select(impl_->db, kOp);
  // Two statements rather than "(?2 = '' OR name = ?2)", which would keep
  // the planner off the (job_id, name) index.
  STAGEWISE_RETURN_IF_ERROR(select.Prepare(
      name.empty() ? "SELECT step, name, value, unix_ms FROM metrics WHERE job_id = ?1 ORDER BY id"
                   : "SELECT step, name, value, unix_ms FROM metrics "
                     "WHERE job_id = ?1 AND name = ?2 ORDER BY id"));
  select.BindText(1, job_id);
  if (!name.empty()) select.BindText(2, name);
  std::vector<MetricPoint> points;
  for (;;) {
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
    if (!row) break;
    MetricPoint& point = points.emplace_back();
    point.step = select.Int64(0);
    point.name = select.Text(1);
    point.value = select.DoubleOrNaN(2);
    point.unix_ms = select.Int64(3);
  }
  return points;
}

absl::Status JobStore::AppendTrace(const std::string& job_id, const v1::TraceChunk& chunk) {
  constexpr absl::string_view kOp = "JobStore::AppendTrace";
  STAGEWISE_RETURN_IF_ERROR(CheckJobId(job_id, "job_id"));
  const std::string bytes = chunk.SerializeAsString();
  absl::MutexLock lock(&impl_->mu);
  WriteTxn txn(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(txn.Begin());
  STAGEWISE_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id, kOp));
  if (!exists) return JobNotFound(job_id);
  Stmt insert(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      insert.Prepare("INSERT INTO traces (job_id, stage, spans, chunk) VALUES (?1, ?2, ?3, ?4)"));
  insert.BindText(1, job_id);
  insert.BindInt64(2, chunk.stage());
  insert.BindInt64(3, chunk.spans_size());
  insert.BindBlob(4, bytes);
  STAGEWISE_RETURN_IF_ERROR(insert.Run());
  return txn.Commit();
}

absl::StatusOr<int64_t> JobStore::TraceSpans(const std::string& job_id) const {
  constexpr absl::string_view kOp = "JobStore::TraceSpans";
  absl::MutexLock lock(&impl_->mu);
  Stmt select(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      select.Prepare("SELECT COALESCE(SUM(spans), 0) FROM traces WHERE job_id = ?1"));
  select.BindText(1, job_id);
  STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
  return row ? select.Int64(0) : 0;
}

absl::StatusOr<std::vector<v1::TraceChunk>> JobStore::Trace(const std::string& job_id) const {
  constexpr absl::string_view kOp = "JobStore::Trace";
  absl::MutexLock lock(&impl_->mu);
  STAGEWISE_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id, kOp));
  if (!exists) return JobNotFound(job_id);
  Stmt select(impl_->db, kOp);
  STAGEWISE_RETURN_IF_ERROR(
      select.Prepare("SELECT chunk FROM traces WHERE job_id = ?1 ORDER BY id"));
  select.BindText(1, job_id);
  std::vector<v1::TraceChunk> chunks;
  for (;;) {
    STAGEWISE_ASSIGN_OR_RETURN(const bool row, select.Step());
    if (!row) break;
    if (!select.ParseProto(0, &chunks.emplace_back())) {
      return absl::DataLossError(
          absl::StrCat(kOp, ": a stored trace chunk of job ", job_id, " does not parse"));
    }
  }
  return chunks;
}

std::string JobStore::NewJobId() const {
  absl::MutexLock lock(&impl_->mu);
  std::string id;
  // 2^32 ids: a collision is rare, a second one in a row rarer still. If the
  // lookup itself fails the id is returned unchecked; CreateJob still
  // rejects a duplicate with ALREADY_EXISTS.
  for (int attempt = 0; attempt < 16; ++attempt) {
    id = absl::StrFormat("job-%08x", absl::Uniform<uint32_t>(impl_->bitgen));
    absl::StatusOr<bool> taken = impl_->JobExists(id, "JobStore::NewJobId");
    if (!taken.ok() || !*taken) break;
  }
  return id;
}

}  // namespace stagewise::coordinator

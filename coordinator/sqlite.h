// SQLite plumbing of the job store (store.cc): result codes as absl::Status,
// prepared statements finalized on scope exit, write transactions rolled
// back unless committed. Not thread-safe: callers hold the store's lock.
#ifndef STAGEWISE_COORDINATOR_SQLITE_H_
#define STAGEWISE_COORDINATOR_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
#include "services/common/status_macros.h"

namespace stagewise::coordinator::sql {

// The one place an sqlite result code becomes an absl::Status: UNAVAILABLE
// for a busy or locked database, INTERNAL otherwise; the text names `op`.
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view op);

// Runs constant SQL (no user data: that always goes through Stmt binds).
absl::Status Exec(sqlite3* db, const char* sql, absl::string_view op);

// A prepared statement, finalized on scope exit. Bind errors are kept and
// reported by the next Step(), so call sites stay linear.
class Stmt {
 public:
  Stmt(sqlite3* db, absl::string_view op) : db_(db), op_(op) {}
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  absl::Status Prepare(absl::string_view sql) {
    const int rc =
        sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, op_);
    return absl::OkStatus();
  }

  void BindInt64(int index, int64_t value) { Check(sqlite3_bind_int64(stmt_, index, value)); }
  void BindDouble(int index, double value) { Check(sqlite3_bind_double(stmt_, index, value)); }
  // A null data pointer would bind SQL NULL, hence the "" for empty views.
  void BindText(int index, absl::string_view value) {
    Check(sqlite3_bind_text64(stmt_, index, value.empty() ? "" : value.data(), value.size(),
                              SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  void BindBlob(int index, absl::string_view value) {
    Check(sqlite3_bind_blob64(stmt_, index, value.empty() ? "" : value.data(), value.size(),
                              SQLITE_TRANSIENT));
  }

  // True when a row is ready, false when the statement is done.
  absl::StatusOr<bool> Step() {
    if (!bind_status_.ok()) return bind_status_;
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, op_);
  }
  // For statements that return no rows.
  absl::Status Run() { return Step().status(); }
  // Rewinds for another execution with new binds.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  int64_t Int64(int column) const { return sqlite3_column_int64(stmt_, column); }
  double DoubleOrNaN(int column) const {
    if (sqlite3_column_type(stmt_, column) == SQLITE_NULL) {
      return std::numeric_limits<double>::quiet_NaN();
    }
    return sqlite3_column_double(stmt_, column);
  }
  std::string Text(int column) const {
    const unsigned char* text = sqlite3_column_text(stmt_, column);
    const int size = sqlite3_column_bytes(stmt_, column);
    if (text == nullptr) return std::string();
    return std::string(reinterpret_cast<const char*>(text), size);
  }
  bool ParseProto(int column, google::protobuf::MessageLite* message) const {
    const void* data = sqlite3_column_blob(stmt_, column);
    const int size = sqlite3_column_bytes(stmt_, column);
    return message->ParseFromArray(data == nullptr ? "" : data, size);
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_status_.ok()) bind_status_ = SqliteError(db_, rc, op_);
  }

  sqlite3* db_;
  std::string op_;
  sqlite3_stmt* stmt_ = nullptr;
  absl::Status bind_status_;
};

// BEGIN IMMEDIATE ... COMMIT, rolled back on scope exit unless committed.
// IMMEDIATE takes the write lock up front, so a read-then-write transaction
// never fails half-way on a lock upgrade (and waits out busy_timeout instead).
class WriteTxn {
 public:
  WriteTxn(sqlite3* db, absl::string_view op) : db_(db), op_(op) {}
  ~WriteTxn() {
    if (active_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  WriteTxn(const WriteTxn&) = delete;
  WriteTxn& operator=(const WriteTxn&) = delete;

  absl::Status Begin() {
    STAGEWISE_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE", absl::StrCat(op_, " (begin)")));
    active_ = true;
    return absl::OkStatus();
  }
  absl::Status Commit() {
    STAGEWISE_RETURN_IF_ERROR(Exec(db_, "COMMIT", absl::StrCat(op_, " (commit)")));
    active_ = false;
    return absl::OkStatus();
  }

 private:
  sqlite3* db_;
  std::string op_;
  bool active_ = false;
};

}  // namespace stagewise::coordinator::sql

#endif  // STAGEWISE_COORDINATOR_SQLITE_H_

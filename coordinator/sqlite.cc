#include "coordinator/sqlite.h"

#include <string>
#include <utility>

namespace stagewise::coordinator::sql {

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view op) {
  const char* message = sqlite3_errstr(rc);
  // errmsg is more specific ("UNIQUE constraint failed: ...") but only
  // describes the most recent call on the connection.
  if (db != nullptr && sqlite3_extended_errcode(db) == rc) message = sqlite3_errmsg(db);
  std::string text = absl::StrCat(op, ": ", message, " (sqlite error ", rc, ")");
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(std::move(text));
    default:
      return absl::InternalError(std::move(text));
  }
}

absl::Status Exec(sqlite3* db, const char* sql, absl::string_view op) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db, rc, op);
  return absl::OkStatus();
}

}  // namespace stagewise::coordinator::sql

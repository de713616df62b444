// The few SQLite handles and helpers the controller's stores share (the job store and the metric
// history): owning pointers for a connection and a statement, and errors that name the file.
#pragma once

#include <sqlite3.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace rlhfd::controller::sqlite {

struct DatabaseCloser {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
struct StatementFinalizer {
  void operator()(sqlite3_stmt* statement) const { sqlite3_finalize(statement); }
};
using Database = std::unique_ptr<sqlite3, DatabaseCloser>;
using Statement = std::unique_ptr<sqlite3_stmt, StatementFinalizer>;

// UNAVAILABLE naming the database file, what was being done and SQLite's reason.
inline absl::Status Error(const std::string& path, sqlite3* db, const char* what) {
  return absl::UnavailableError(
      absl::StrCat(path, ": ", what, ": ", db ? sqlite3_errmsg(db) : "out of memory"));
}

inline absl::StatusOr<Statement> Prepare(const std::string& path, sqlite3* db, const char* sql) {
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &statement, nullptr) != SQLITE_OK) {
    return Error(path, db, "preparing a statement");
  }
  return Statement(statement);
}

// Opens (creating) `path` read-write, waits up to 5 s on a lock, and runs `setup` (pragmas and
// schema). DATA_LOSS when the file is not a database this controller can use, naming what to do.
inline absl::StatusOr<Database> OpenDatabase(const std::string& path, const char* what,
                                             const char* setup) {
  sqlite3* raw = nullptr;
  const int opened =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  Database db(raw);
  if (opened != SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot open the ", what, ": ",
                                               raw ? sqlite3_errmsg(raw) : "out of memory"));
  }
  sqlite3_busy_timeout(db.get(), 5000);
  char* error = nullptr;
  if (sqlite3_exec(db.get(), setup, nullptr, nullptr, &error) != SQLITE_OK) {
    const std::string message = error ? error : "unknown error";
    sqlite3_free(error);
    return absl::DataLossError(absl::StrCat(path, " is not a ", what, " this controller can use: ",
                                            message, "; move it aside to start a new one"));
  }
  return db;
}

}  // namespace rlhfd::controller::sqlite

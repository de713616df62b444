#include "controller/store/metric_history.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/metric_value.h"
#include "controller/store/sqlite.h"
#include "nlohmann/json.hpp"

namespace rlhfd::controller {
namespace {

using sqlite::DatabaseCloser;
using sqlite::Statement;

class SqliteMetricHistory final : public MetricHistory {
 public:
  SqliteMetricHistory(std::unique_ptr<sqlite3, DatabaseCloser> db, std::string path)
      : db_(std::move(db)), path_(std::move(path)) {}

  absl::Status Put(const std::string& job_id, const v1::StepMetrics& step) override {
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [name, value] : step.metrics()) metrics[name] = MetricToJson(value);
    ASSIGN_OR_RETURN(Statement statement,
                     Prepare("INSERT OR REPLACE INTO steps (job_id, step, time_ms, metrics) "
                             "VALUES (?1, ?2, ?3, ?4)"));
    const std::string text = metrics.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    sqlite3_bind_text(statement.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int64(statement.get(), 2, step.step());
    sqlite3_bind_int64(statement.get(), 3, step.time_ms());
    sqlite3_bind_text(statement.get(), 4, text.data(), static_cast<int>(text.size()),
                      SQLITE_TRANSIENT);
    if (sqlite3_step(statement.get()) != SQLITE_DONE) return Error("recording a step");
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<v1::StepMetrics>> Get(const std::string& job_id,
                                                   int64_t after_step) override {
    // A connection of this read's own: under WAL it reads a snapshot while the loop writes.
    sqlite3* raw = nullptr;
    const int opened =
        sqlite3_open_v2(path_.c_str(), &raw, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
    std::unique_ptr<sqlite3, DatabaseCloser> reader(raw);
    if (opened != SQLITE_OK) return Error(reader.get(), "opening it to read");
    sqlite3_busy_timeout(reader.get(), 5000);
    ASSIGN_OR_RETURN(Statement statement, Prepare(reader.get(),
                                                  "SELECT step, time_ms, metrics FROM steps WHERE "
                                                  "job_id = ?1 AND step > ?2 ORDER BY step"));
    sqlite3_bind_text(statement.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                      SQLITE_TRANSIENT);
    // 0 means from the first: validation before training is step 0.
    sqlite3_bind_int64(statement.get(), 2, after_step == 0 ? -1 : after_step);
    std::vector<v1::StepMetrics> steps;
    int result;
    while ((result = sqlite3_step(statement.get())) == SQLITE_ROW) {
      v1::StepMetrics step;
      step.set_step(sqlite3_column_int64(statement.get(), 0));
      step.set_time_ms(sqlite3_column_int64(statement.get(), 1));
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(statement.get(), 2));
      const nlohmann::json metrics =
          nlohmann::json::parse(text == nullptr ? "{}" : text, nullptr, false);
      if (metrics.is_object()) {
        for (const auto& [name, value] : metrics.items()) {
          if (const std::optional<double> read = MetricFromJson(value)) {
            (*step.mutable_metrics())[name] = *read;
          }
        }
      }
      steps.push_back(std::move(step));
    }
    if (result != SQLITE_DONE) return Error(reader.get(), "reading steps");
    return steps;
  }

  absl::Status Remove(const std::string& job_id) override {
    ASSIGN_OR_RETURN(Statement statement, Prepare("DELETE FROM steps WHERE job_id = ?1"));
    sqlite3_bind_text(statement.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                      SQLITE_TRANSIENT);
    if (sqlite3_step(statement.get()) != SQLITE_DONE) return Error("removing a job's steps");
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<Statement> Prepare(const char* sql) { return Prepare(db_.get(), sql); }
  absl::StatusOr<Statement> Prepare(sqlite3* db, const char* sql) const {
    return sqlite::Prepare(path_, db, sql);
  }
  absl::Status Error(const char* what) const { return Error(db_.get(), what); }
  absl::Status Error(sqlite3* db, const char* what) const { return sqlite::Error(path_, db, what); }

  std::unique_ptr<sqlite3, DatabaseCloser> db_;
  std::string path_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricHistory>> OpenSqliteMetricHistory(const std::string& path) {
  // WAL: a reader never blocks the writer, and a kill -9 loses at most the write in progress;
  // synchronous=FULL makes each committed step durable before it is acknowledged.
  ASSIGN_OR_RETURN(
      sqlite::Database db,
      sqlite::OpenDatabase(
          path, "metric history",
          "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
          "CREATE TABLE IF NOT EXISTS steps (job_id TEXT NOT NULL, step INTEGER NOT NULL, "
          "time_ms INTEGER NOT NULL, metrics TEXT NOT NULL, PRIMARY KEY (job_id, step));"));
  return std::unique_ptr<MetricHistory>(new SqliteMetricHistory(std::move(db), path));
}

}  // namespace rlhfd::controller

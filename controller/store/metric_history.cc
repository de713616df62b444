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
    // One transaction: a step's metrics and samples are recorded (or replaced) together.
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", "recording a step"));
    absl::Status put = PutMetrics(job_id, step);
    if (put.ok()) put = PutSamples(job_id, step);
    if (put.ok()) return Exec("COMMIT", "recording a step");
    (void)Exec("ROLLBACK", "recording a step");
    return put;
  }

  absl::StatusOr<std::vector<v1::StepMetrics>> Get(const std::string& job_id,
                                                   int64_t after_step) override {
    std::vector<v1::StepMetrics> steps;
    RETURN_IF_ERROR(
        Read("SELECT step, time_ms, metrics FROM steps WHERE job_id = ?1 AND step > ?2 "
             "ORDER BY step",
             job_id, after_step, "reading steps", [&](sqlite3_stmt* row) {
               v1::StepMetrics step;
               step.set_step(sqlite3_column_int64(row, 0));
               step.set_time_ms(sqlite3_column_int64(row, 1));
               const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(row, 2));
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
             }));
    return steps;
  }

  absl::StatusOr<std::vector<v1::StepMetrics>> GetSamples(const std::string& job_id,
                                                          int64_t after_step) override {
    std::vector<v1::StepMetrics> steps;
    static const std::string kSelect = absl::StrCat(
        "SELECT step, time_ms, samples FROM samples WHERE job_id = ?1 AND step > ?2 ORDER BY step "
        "LIMIT ",
        kMaxSampleSteps);
    RETURN_IF_ERROR(
        Read(kSelect.c_str(), job_id, after_step, "reading samples", [&](sqlite3_stmt* row) {
          v1::StepMetrics step;
          // A record this controller did not write whole is passed over, not an error.
          if (!step.ParseFromArray(sqlite3_column_blob(row, 2), sqlite3_column_bytes(row, 2))) {
            return;
          }
          step.clear_metrics();
          step.set_step(sqlite3_column_int64(row, 0));
          step.set_time_ms(sqlite3_column_int64(row, 1));
          steps.push_back(std::move(step));
        }));
    return steps;
  }

  absl::Status Remove(const std::string& job_id) override {
    for (const char* sql :
         {"DELETE FROM steps WHERE job_id = ?1", "DELETE FROM samples WHERE job_id = ?1"}) {
      ASSIGN_OR_RETURN(Statement statement, Prepare(sql));
      sqlite3_bind_text(statement.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                        SQLITE_TRANSIENT);
      if (sqlite3_step(statement.get()) != SQLITE_DONE) return Error("removing a job's steps");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status PutMetrics(const std::string& job_id, const v1::StepMetrics& step) {
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

  // The step's samples replace what an earlier run of it left; a step without any leaves none.
  absl::Status PutSamples(const std::string& job_id, const v1::StepMetrics& step) {
    if (step.samples().empty()) {
      ASSIGN_OR_RETURN(Statement statement,
                       Prepare("DELETE FROM samples WHERE job_id = ?1 AND step = ?2"));
      sqlite3_bind_text(statement.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                        SQLITE_TRANSIENT);
      sqlite3_bind_int64(statement.get(), 2, step.step());
      if (sqlite3_step(statement.get()) != SQLITE_DONE) return Error("recording samples");
      return absl::OkStatus();
    }
    // The samples as a StepMetrics message of their own (protobuf wire format).
    v1::StepMetrics only_samples;
    *only_samples.mutable_samples() = step.samples();
    const std::string bytes = only_samples.SerializeAsString();
    ASSIGN_OR_RETURN(Statement statement,
                     Prepare("INSERT OR REPLACE INTO samples (job_id, step, time_ms, samples) "
                             "VALUES (?1, ?2, ?3, ?4)"));
    sqlite3_bind_text(statement.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int64(statement.get(), 2, step.step());
    sqlite3_bind_int64(statement.get(), 3, step.time_ms());
    sqlite3_bind_blob(statement.get(), 4, bytes.data(), static_cast<int>(bytes.size()),
                      SQLITE_TRANSIENT);
    if (sqlite3_step(statement.get()) != SQLITE_DONE) return Error("recording samples");
    return absl::OkStatus();
  }

  absl::Status Exec(const char* sql, const char* what) {
    if (sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr) != SQLITE_OK) return Error(what);
    return absl::OkStatus();
  }

  // Runs `sql` (binding the job id and the step after which to read) on a connection of this
  // read's own: under WAL it reads a snapshot while the loop writes. `row` sees each row.
  template <typename Row>
  absl::Status Read(const char* sql, const std::string& job_id, int64_t after_step,
                    const char* what, Row&& row) const {
    sqlite3* raw = nullptr;
    const int opened =
        sqlite3_open_v2(path_.c_str(), &raw, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
    std::unique_ptr<sqlite3, DatabaseCloser> reader(raw);
    if (opened != SQLITE_OK) return Error(reader.get(), "opening it to read");
    sqlite3_busy_timeout(reader.get(), 5000);
    ASSIGN_OR_RETURN(Statement statement, Prepare(reader.get(), sql));
    sqlite3_bind_text(statement.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                      SQLITE_TRANSIENT);
    // 0 means from the first: validation before training is step 0.
    sqlite3_bind_int64(statement.get(), 2, after_step == 0 ? -1 : after_step);
    int result;
    while ((result = sqlite3_step(statement.get())) == SQLITE_ROW) row(statement.get());
    if (result != SQLITE_DONE) return Error(reader.get(), what);
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
          "time_ms INTEGER NOT NULL, metrics TEXT NOT NULL, PRIMARY KEY (job_id, step));"
          // A table of its own, so a history from before samples opens as it is.
          "CREATE TABLE IF NOT EXISTS samples (job_id TEXT NOT NULL, step INTEGER NOT NULL, "
          "time_ms INTEGER NOT NULL, samples BLOB NOT NULL, PRIMARY KEY (job_id, step));"));
  return std::unique_ptr<MetricHistory>(new SqliteMetricHistory(std::move(db), path));
}

}  // namespace rlhfd::controller

// JobStore: the controller's durable record of jobs, a row per job in <state_dir>/jobs.db
// (SQLite, WAL, synchronous=FULL). Each change is one transaction, durable (one fsync of the
// log) before it returns, so a restarted controller finds every job as it was last written and
// never a half-written one. Job numbers come from a counter committed in the same transaction
// as the job they number, so a number is never given twice, even after a job is deleted.
// A store of JSON files (<state_dir>/jobs/job-<n>.json, this store's older form) is imported
// on open. Used from one thread (the controller's event loop).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/store/sqlite.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

// "job-<n>" with n a positive decimal without sign, spaces or leading zeros; the only spelling
// of a job id the controller accepts, so one job has one name.
bool ParseJobId(const std::string& job_id, int64_t* number);
std::string JobId(int64_t number);

class JobStore {
 public:
  // A stored job is at most this large; a job holds a config of at most 1 MiB.
  static constexpr size_t kMaxJobBytes = 8 << 20;

  // Opens (creating) <state_dir>/jobs.db and imports the job files of the older store.
  static absl::StatusOr<JobStore> Open(const std::string& state_dir);

  // Calls `visit` with every stored job, oldest first (start-up). A record that does not parse
  // or names another job is moved to the corrupt_jobs table and logged, never fatal: one bad
  // record must not keep the controller down.
  absl::Status ForEach(const std::function<void(v1::Job)>& visit);

  // The job numbered `number`; NOT_FOUND when none is stored.
  absl::StatusOr<v1::Job> Get(int64_t number) const;

  // Numbers `job` (sets its job_id) and stores it, both in one transaction: higher than every
  // number handed out before. INVALID_ARGUMENT for a job too large to keep.
  absl::Status Insert(v1::Job* job);
  // Replaces a stored job's record. INVALID_ARGUMENT for a job too large to keep.
  absl::Status Put(const v1::Job& job);
  // Deletes the job's record (its number stays used).
  absl::Status Remove(int64_t number);

 private:
  JobStore(sqlite::Database db, std::string path, int64_t next_number)
      : db_(std::move(db)), path_(std::move(path)), next_number_(next_number) {}

  absl::StatusOr<sqlite::Statement> Prepare(const char* sql) const;
  absl::Status Error(const char* what) const;
  absl::StatusOr<std::string> Serialize(const v1::Job& job) const;
  // Runs `body` in one transaction, rolled back when it fails.
  absl::Status InTransaction(const std::function<absl::Status()>& body);
  absl::Status ImportJsonFiles(const std::string& jobs_dir);

  sqlite::Database db_;
  std::string path_;
  int64_t next_number_;
};

}  // namespace rlhfd::controller

// JobStore: the controller's durable record of jobs, one JSON file per job under
// <state_dir>/jobs/, each replaced atomically, so a restarted controller finds every job as it
// was last written and never a half-written one. Job numbers are handed out from a counter kept
// on disk beside them, so a number is never given twice, even when a job's file is lost.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

// "job-<n>" with n a positive decimal without sign, spaces or leading zeros; the only spelling
// of a job id the controller accepts, so one job has one name.
bool ParseJobId(const std::string& job_id, int64_t* number);
std::string JobId(int64_t number);

class JobStore {
 public:
  // A job file is at most this large; a job holds a config of at most 1 MiB.
  static constexpr size_t kMaxJobFileBytes = 8 << 20;

  // Creates <state_dir>/jobs if needed and removes temporary files a crash left behind.
  static absl::StatusOr<JobStore> Open(const std::string& state_dir);

  // Every stored job. A file that does not parse is renamed to *.corrupt and reported in the
  // log, never fatal: one bad file must not keep the controller down.
  std::vector<v1::Job> LoadAll() const;

  // The number of the next job, made durable before it is returned: higher than every number
  // handed out before and every job file (corrupt ones included).
  absl::StatusOr<int64_t> ReserveJobNumber();

  // Writes (or replaces) the job's file. INVALID_ARGUMENT for a job too large to read back.
  absl::Status Put(const v1::Job& job) const;
  // Deletes the job's file (its number stays used).
  absl::Status Remove(const std::string& job_id) const;

 private:
  JobStore(std::string jobs_dir, int64_t next_number)
      : jobs_dir_(std::move(jobs_dir)), next_number_(next_number) {}

  std::string jobs_dir_;
  int64_t next_number_;
};

}  // namespace rlhfd::controller

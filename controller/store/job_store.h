// JobStore: the controller's durable record of jobs, one JSON file per job under
// <state_dir>/jobs/, each replaced atomically, so a restarted controller finds every job as it
// was last written and never a half-written one.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

class JobStore {
 public:
  // Creates <state_dir>/jobs if needed.
  static absl::StatusOr<JobStore> Open(const std::string& state_dir);

  // Every stored job. A file that does not parse is renamed to *.corrupt and reported in the
  // log, never fatal: one bad file must not keep the controller down.
  std::vector<v1::Job> LoadAll() const;

  // Writes (or replaces) the job's file.
  absl::Status Put(const v1::Job& job) const;

 private:
  explicit JobStore(std::string jobs_dir) : jobs_dir_(std::move(jobs_dir)) {}
  std::string jobs_dir_;
};

}  // namespace rlhfd::controller

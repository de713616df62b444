// File-per-job store on top of the atomic file writer.
#include "controller/store/job_store.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd::controller {
namespace {

constexpr char kJobPrefix[] = "job-";
constexpr char kCounterFile[] = "next_job_number";

// The job number a file name in the jobs directory stands for ("job-12.json",
// "job-12.json.corrupt"); 0 for other names.
int64_t NumberOfFile(const std::string& name) {
  const size_t dot = name.find('.');
  int64_t number = 0;
  return ParseJobId(name.substr(0, dot), &number) ? number : 0;
}

}  // namespace

bool ParseJobId(const std::string& job_id, int64_t* number) {
  constexpr size_t prefix = sizeof(kJobPrefix) - 1;
  if (job_id.size() <= prefix || job_id.size() > prefix + 18 || !absl::StartsWith(job_id, kJobPrefix)) {
    return false;
  }
  const absl::string_view digits = absl::string_view(job_id).substr(prefix);
  if (digits[0] == '0') return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(digits, number) && *number > 0;
}

std::string JobId(int64_t number) { return absl::StrCat(kJobPrefix, number); }

absl::StatusOr<JobStore> JobStore::Open(const std::string& state_dir) {
  const std::string jobs_dir = state_dir + "/jobs";
  RETURN_IF_ERROR(MakePrivateDirectory(jobs_dir));
  if (const int removed = RemoveStaleTemporaries(jobs_dir); removed > 0) {
    RLOG(WARNING) << "job store: removed " << removed << " temporary files left by a crash";
  }
  int64_t next = 1;
  auto counter = ReadFileToString(jobs_dir + "/" + kCounterFile, 64);
  if (counter.ok()) {
    int64_t stored = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*counter), &stored) && stored > 0) {
      next = stored;
    } else {
      RLOG(ERROR) << "job store: " << jobs_dir << "/" << kCounterFile
                 << " is unreadable; numbering continues after the highest job file";
    }
  } else if (!absl::IsNotFound(counter.status())) {
    RLOG(ERROR) << "job store: " << counter.status().message();
  }
  // Files count too: a store written before the counter existed, or a counter lost with a disk.
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(jobs_dir));
  for (const std::string& name : names) next = std::max(next, NumberOfFile(name) + 1);
  return JobStore(jobs_dir, next);
}

std::vector<v1::Job> JobStore::LoadAll() const {
  std::vector<v1::Job> jobs;
  auto names = ListDirectory(jobs_dir_);
  if (!names.ok()) {
    RLOG(ERROR) << "job store: " << names.status().message();
    return jobs;
  }
  for (const std::string& name : *names) {
    const std::string path = jobs_dir_ + "/" + name;
    if (!absl::EndsWith(name, ".json") || name[0] == '.' || IsDirectory(path)) continue;
    auto text = ReadFileToString(path, kMaxJobFileBytes);
    v1::Job job;
    absl::Status status = text.status();
    if (text.ok()) {
      int64_t number = 0;
      auto parsed = google::protobuf::util::JsonStringToMessage(*text, &job);
      if (!parsed.ok()) {
        status = absl::DataLossError(parsed.ToString());
      } else if (!ParseJobId(job.job_id(), &number) || NumberOfFile(name) != number) {
        status = absl::DataLossError("the job id inside does not match the file name");
      }
    }
    if (!status.ok()) {
      RLOG(ERROR) << "job store: " << path << " is unreadable (" << status
                 << "); moved aside to " << path << ".corrupt";
      ::rename(path.c_str(), (path + ".corrupt").c_str());
      continue;
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<int64_t> JobStore::ReserveJobNumber() {
  const int64_t number = next_number_;
  RETURN_IF_ERROR(
      WriteFileAtomically(jobs_dir_ + "/" + kCounterFile, absl::StrCat(number + 1, "\n"), 0600));
  next_number_ = number + 1;
  return number;
}

absl::Status JobStore::Remove(const std::string& job_id) const {
  return RemoveTree(absl::StrCat(jobs_dir_, "/", job_id, ".json"));
}

absl::Status JobStore::Put(const v1::Job& job) const {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = true;
  auto printed = google::protobuf::util::MessageToJsonString(job, &json, options);
  if (!printed.ok()) return absl::InternalError(printed.ToString());
  if (json.size() > kMaxJobFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.job_id(), " would take ",
                                                   json.size(), " bytes on disk; at most ",
                                                   kMaxJobFileBytes, " are kept"));
  }
  return WriteFileAtomically(absl::StrCat(jobs_dir_, "/", job.job_id(), ".json"), json, 0600);
}

}  // namespace rlhfd::controller

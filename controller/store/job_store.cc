// File-per-job store on top of the atomic file writer.
#include "controller/store/job_store.h"

#include <google/protobuf/util/json_util.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd::controller {

absl::StatusOr<JobStore> JobStore::Open(const std::string& state_dir) {
  const std::string jobs_dir = state_dir + "/jobs";
  RETURN_IF_ERROR(MakeDirectories(jobs_dir, 0700));
  return JobStore(jobs_dir);
}

std::vector<v1::Job> JobStore::LoadAll() const {
  std::vector<v1::Job> jobs;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(jobs_dir_, error)) {
    const std::string path = entry.path().string();
    if (!entry.is_regular_file() || !absl::EndsWith(path, ".json")) continue;
    auto text = ReadFileToString(path);
    v1::Job job;
    absl::Status status = text.status();
    if (text.ok()) {
      auto parsed = google::protobuf::util::JsonStringToMessage(*text, &job);
      if (!parsed.ok()) status = absl::DataLossError(parsed.ToString());
      else if (job.job_id().empty()) status = absl::DataLossError("no job_id");
    }
    if (!status.ok()) {
      LOG(ERROR) << "job store: " << path << " is unreadable (" << status
                 << "); moved aside to " << path << ".corrupt";
      std::filesystem::rename(path, path + ".corrupt", error);
      continue;
    }
    jobs.push_back(std::move(job));
  }
  if (error) LOG(ERROR) << "job store: cannot list " << jobs_dir_ << ": " << error.message();
  return jobs;
}

absl::Status JobStore::Put(const v1::Job& job) const {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = true;
  auto printed = google::protobuf::util::MessageToJsonString(job, &json, options);
  if (!printed.ok()) return absl::InternalError(printed.ToString());
  return WriteFileAtomically(absl::StrCat(jobs_dir_, "/", job.job_id(), ".json"), json, 0600);
}

}  // namespace rlhfd::controller

// File-per-job store on top of the atomic file writer.
#include "controller/store/job_store.h"

#include <google/protobuf/util/json_util.h>

#include <cstdio>

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
  auto names = ListDirectory(jobs_dir_);
  if (!names.ok()) {
    LOG(ERROR) << "job store: " << names.status().message();
    return jobs;
  }
  for (const std::string& name : *names) {
    const std::string path = jobs_dir_ + "/" + name;
    if (!absl::EndsWith(name, ".json") || IsDirectory(path)) continue;
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
      ::rename(path.c_str(), (path + ".corrupt").c_str());
      continue;
    }
    jobs.push_back(std::move(job));
  }
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

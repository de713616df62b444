#include "worker/roles/checkpoint_mirror.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "worker/roles/checkpoint.h"

namespace rlhfd::roles {
namespace {

// `status` with its message prefixed by what the mirror was doing.
absl::Status Within(const absl::Status& status, absl::string_view doing) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("trainer.checkpoint_uri: ", doing, ": ", status.message()));
}

// Regular files under `root`, relative to it, in directory order.
absl::Status ListFiles(const std::string& root, const std::string& relative,
                       std::vector<std::string>& files) {
  const std::string path = relative.empty() ? root : absl::StrCat(root, "/", relative);
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDirectory(path));
  for (const std::string& name : names) {
    const std::string child = relative.empty() ? name : absl::StrCat(relative, "/", name);
    if (IsDirectory(absl::StrCat(root, "/", child))) {
      RETURN_IF_ERROR(ListFiles(root, child, files));
    } else if (name.find(".tmp.") == std::string::npos) {  // a writer's temporary
      files.push_back(child);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<CheckpointMirror>> CheckpointMirror::Open(
    const std::string& uri, std::shared_ptr<const std::atomic<bool>> cancelled,
    absl::Duration fault_hold) {
  absl::StatusOr<S3Location> location = ParseS3Uri(uri);
  if (!location.ok()) return Within(location.status(), "parsing it");
  absl::StatusOr<net::S3Options> options = net::S3OptionsFromEnvironment();
  if (!options.ok()) return options.status();
  options->cancelled = std::move(cancelled);
  return std::make_shared<CheckpointMirror>(*std::move(location), *std::move(options), fault_hold);
}

CheckpointMirror::CheckpointMirror(S3Location location, net::S3Options options,
                                   absl::Duration fault_hold)
    : location_(std::move(location)),
      cancelled_(options.cancelled),
      client_(location_.bucket, std::move(options)),
      fault_hold_(fault_hold) {}

std::string CheckpointMirror::Describe(const std::string& relative) const {
  return client_.Describe(Key(relative));
}

absl::Status CheckpointMirror::CheckNotLeftBehind(const CheckpointWriter& writer, int64_t step) {
  return roles::CheckNotLeftBehind(writer, step, [this](const std::string& relative) {
    return client_.GetObject(Key(relative), 1 << 20);
  });
}

absl::Status CheckpointMirror::UploadPart(const std::string& dir, int64_t step,
                                          const std::string& role, int rank,
                                          const CheckpointWriter& writer) {
  const std::string part = RankPartName(step, role, rank);
  const std::string local = absl::StrCat(dir, "/", part);
  const std::string doing = absl::StrCat("uploading ", local, " to ", Describe(part));
  absl::StatusOr<std::string> manifest =
      ReadFileToString(absl::StrCat(local, "/", kManifestName), 1 << 20);
  if (!manifest.ok()) return Within(manifest.status(), doing);
  absl::StatusOr<std::vector<std::string>> names = ManifestFileNames(*manifest);
  if (!names.ok()) return Within(names.status(), doing);
  // A step saved again (a resume went back past it) is no longer committed in the bucket while
  // its parts are replaced, as SaveRoleState un-commits it on disk; but not by a worker the job
  // left behind, whose save would un-commit a later attempt's step.
  RETURN_IF_ERROR(Within(CheckNotLeftBehind(writer, step), doing));
  RETURN_IF_ERROR(Within(client_.DeleteObject(Key(CommitRecordName(step))), doing));
  for (const std::string& name : *names) {
    const std::string relative = absl::StrCat(part, "/", name);
    RETURN_IF_ERROR(
        Within(client_.UploadFile(Key(relative), absl::StrCat(dir, "/", relative)), doing));
  }
  if (fault_hold_ > absl::ZeroDuration()) {
    RLOG(WARNING) << "--fault_hold_checkpoint_upload: the manifest of " << Describe(part)
                  << " goes up in " << fault_hold_;
    // Ends early when the attempt is cancelled, as a real upload would: the worker's next
    // attempt waits for this one on its executor.
    const absl::Time until = absl::Now() + fault_hold_;
    while (absl::Now() < until && !(cancelled_ && cancelled_->load())) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  return Within(client_.PutObject(Key(absl::StrCat(part, "/", kManifestName)), *manifest), doing);
}

absl::Status CheckpointMirror::UploadTree(const std::string& dir, const std::string& relative) {
  const std::string doing = absl::StrCat("uploading ", dir, "/", relative);
  std::vector<std::string> files;
  RETURN_IF_ERROR(Within(ListFiles(absl::StrCat(dir, "/", relative), "", files), doing));
  for (const std::string& file : files) {
    const std::string name = absl::StrCat(relative, "/", file);
    RETURN_IF_ERROR(Within(client_.UploadFile(Key(name), absl::StrCat(dir, "/", name)), doing));
  }
  return absl::OkStatus();
}

absl::Status CheckpointMirror::UploadCommit(const std::string& dir, int64_t step,
                                            const CheckpointWriter& writer) {
  const std::string record = CommitRecordName(step);
  const std::string doing = absl::StrCat("uploading the commit of step ", step);
  RETURN_IF_ERROR(Within(CheckNotLeftBehind(writer, step), doing));
  absl::StatusOr<std::string> text = ReadFileToString(absl::StrCat(dir, "/", record), 1 << 20);
  if (!text.ok()) return Within(text.status(), doing);
  RETURN_IF_ERROR(Within(client_.PutObject(Key(record), *text), doing));
  return Within(client_.PutObject(Key(kLatestName), absl::StrCat(StepName(step), "\n")), doing);
}

absl::StatusOr<int64_t> CheckpointMirror::LatestStep() {
  absl::StatusOr<std::string> text = client_.GetObject(Key(kLatestName), 4096);
  if (!text.ok()) return Within(text.status(), "reading the latest step");
  const int64_t step = StepOfName(absl::StripAsciiWhitespace(*text));
  if (step < 1) {
    return absl::DataLossError(absl::StrCat("trainer.checkpoint_uri: ", Describe(kLatestName),
                                            " does not name a step (step_<N>)"));
  }
  return step;
}

absl::Status CheckpointMirror::EnsurePart(const std::string& dir, int64_t step,
                                          const std::string& role, int rank) {
  const std::string part = RankPartName(step, role, rank);
  const std::string local = absl::StrCat(dir, "/", part);
  const std::string manifest_path = absl::StrCat(local, "/", kManifestName);
  const std::string record = CommitRecordName(step);
  const std::string doing = absl::StrCat("downloading ", Describe(part), " to ", local);
  const std::string local_record = absl::StrCat(dir, "/", record);
  // A part here is the committed one only beside its commit record: an uncommitted part (an
  // earlier attempt's, before the job moved) is replaced by the bucket's.
  if (PathExists(local_record) && PathExists(manifest_path)) return absl::OkStatus();
  RETURN_IF_ERROR(Within(MakeDirectories(local), doing));
  absl::StatusOr<std::string> manifest =
      client_.GetObject(Key(absl::StrCat(part, "/", kManifestName)), 1 << 20);
  if (!manifest.ok()) return Within(manifest.status(), doing);
  absl::StatusOr<std::vector<std::string>> names = ManifestFileNames(*manifest);
  if (!names.ok()) return Within(names.status(), doing);
  for (const std::string& name : *names) {
    const std::string relative = absl::StrCat(part, "/", name);
    RETURN_IF_ERROR(
        Within(client_.DownloadFile(Key(relative), absl::StrCat(dir, "/", relative)), doing));
  }
  RETURN_IF_ERROR(Within(WriteFileAtomically(manifest_path, *manifest), doing));
  return Within(client_.DownloadFile(Key(record), local_record), doing);
}

absl::StatusOr<std::vector<int64_t>> CheckpointMirror::RemoveOldSteps(int64_t committed, int keep) {
  std::vector<int64_t> removed;
  if (keep <= 0) return removed;
  const std::string doing = "applying trainer.max_ckpt_to_keep";
  absl::StatusOr<std::vector<std::string>> directories = client_.ListDirectories(Key(""));
  if (!directories.ok()) return Within(directories.status(), doing);
  std::vector<int64_t> steps;
  for (absl::string_view directory : *directories) {
    absl::ConsumeSuffix(&directory, "/");
    const int64_t step = StepOfName(directory.substr(directory.rfind('/') + 1));
    if (step > 0) steps.push_back(step);
  }
  std::vector<int64_t> committed_steps;
  for (const int64_t step : steps) {
    if (step >= committed) continue;
    const absl::StatusOr<std::string> record = client_.GetObject(Key(CommitRecordName(step)));
    if (record.ok()) {
      committed_steps.push_back(step);
    } else if (!absl::IsNotFound(record.status())) {
      return Within(record.status(), doing);
    }
  }
  const int64_t oldest_kept = OldestKeptStep(std::move(committed_steps), committed, keep);
  for (const int64_t step : steps) {
    if (step >= oldest_kept) continue;
    RETURN_IF_ERROR(Within(client_.DeleteObject(Key(CommitRecordName(step))), doing));
    absl::StatusOr<std::vector<std::string>> keys =
        client_.ListKeys(Key(absl::StrCat(StepName(step), "/")));
    if (!keys.ok()) return Within(keys.status(), doing);
    for (const std::string& key : *keys) RETURN_IF_ERROR(Within(client_.DeleteObject(key), doing));
    removed.push_back(step);
  }
  return removed;
}

}  // namespace rlhfd::roles

#include "worker/roles/checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/crc32c.h"
#include "common/util/files.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/state_dict.h"
#include "worker/train/finite_check.h"

namespace rlhfd::roles {
namespace {

using Json = nlohmann::json;

constexpr char kStateFile[] = "state.safetensors";
// 2: each file's size and CRC-32C, the manifest's own CRC, and commit records. 1: none of them.
constexpr int kManifestVersion = 2;
constexpr int kCommitVersion = 1;
// The manifest's CRC-32C of its own compact JSON without this key.
constexpr char kSelfCrcKey[] = "manifest_crc32c";

std::string CommitPath(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/", CommitRecordName(step));
}

absl::Status Damaged(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

// Fields of JSON read from disk, without nlohmann's throwing accessors.
const Json* Field(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto found = object.find(key);
  return found == object.end() ? nullptr : &*found;
}
bool IntegerField(const Json& object, const char* key, int64_t* value) {
  const Json* field = Field(object, key);
  if (field == nullptr || !field->is_number_integer()) return false;
  *value = field->get<int64_t>();
  return true;
}
bool StringField(const Json& object, const char* key, std::string* value) {
  const Json* field = Field(object, key);
  if (field == nullptr || !field->is_string()) return false;
  *value = field->get<std::string>();
  return true;
}

// Steps with a commit record, ascending (none when `dir` cannot be listed).
std::vector<int64_t> CommittedSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  const absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir);
  if (!names.ok()) return steps;
  for (const std::string& name : *names) {
    const int64_t step = StepOfName(name);
    if (step > 0 && PathExists(CommitPath(dir, step))) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The step <dir>/latest names: NOT_FOUND without one, DATA_LOSS when it names none.
absl::StatusOr<int64_t> LatestStep(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kLatestName);
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat(path, " is missing"));
  absl::StatusOr<std::string> text = ReadFilePrefix(path, 64);
  if (!text.ok()) return Damaged(path, text.status().message());
  const int64_t step = StepOfName(absl::StripAsciiWhitespace(*text));
  if (step < 1) return Damaged(path, "does not name a step (step_<N>)");
  return step;
}

// The writer a manifest or commit record names; none for one written before writers were
// recorded.
std::optional<CheckpointWriter> WrittenBy(const Json& record) {
  CheckpointWriter by;
  if (!StringField(record, "job_id", &by.job_id) || !IntegerField(record, "attempt", &by.attempt)) {
    return std::nullopt;
  }
  IntegerField(record, "job_submit_time_ms", &by.job_submit_time_ms);
  return by;
}
bool SameJob(const CheckpointWriter& a, const CheckpointWriter& b) {
  return a.job_id == b.job_id && a.job_submit_time_ms == b.job_submit_time_ms;
}
bool SameAttempt(const CheckpointWriter& a, const CheckpointWriter& b) {
  return SameJob(a, b) && a.attempt == b.attempt;
}
std::string AttemptName(const CheckpointWriter& by) {
  return absl::StrCat("attempt ", by.attempt, " of job ", by.job_id, " (submitted at ",
                      by.job_submit_time_ms, " ms)");
}

// A manifest's file names stay inside the rank's directory, whoever wrote the manifest.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && !absl::StrContains(name, "/") && name != "." && name != "..";
}

std::string SelfCrc(Json manifest) {
  manifest.erase(kSelfCrcKey);
  return Crc32cHex(Crc32c(manifest.dump()));
}

absl::StatusOr<int64_t> WritePart(const std::string& where, int64_t step, const std::string& role,
                                  int rank, const train::TrainedModel::NamedTensors& state,
                                  const Json& extra, const CheckpointWriter& writer) {
  ASSIGN_OR_RETURN(const std::string file, model::SafetensorsBytes(state));
  const uint32_t crc = Crc32c(file);
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(where, "/", kStateFile), file));
  int64_t bytes = 0;
  Json tensors = Json::array();
  for (const auto& [name, tensor] : state) {
    bytes += tensor.numel() * tensor.element_size();
    tensors.push_back(name);
  }
  Json manifest = {
      {"version", kManifestVersion},
      {"step", step},
      {"role", role},
      {"rank", rank},
      {"job_id", writer.job_id},
      {"job_submit_time_ms", writer.job_submit_time_ms},
      {"attempt", writer.attempt},
      {"bytes", bytes},
      {"tensors", tensors},
      {"files",
       {{kStateFile, {{"bytes", static_cast<int64_t>(file.size())}, {"crc32c", Crc32cHex(crc)}}}}},
      {"extra", extra}};
  manifest[kSelfCrcKey] = SelfCrc(manifest);
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(where, "/", kManifestName), manifest.dump(1)));
  return bytes;
}

// Each file the manifest lists has its recorded size and CRC-32C.
absl::Status VerifyFiles(const std::string& where, const Json& manifest) {
  const Json* files = Field(manifest, "files");
  const std::string manifest_path = absl::StrCat(where, "/", kManifestName);
  if (files == nullptr || !files->is_object() || Field(*files, kStateFile) == nullptr) {
    return Damaged(manifest_path, absl::StrCat("lists no checksum of ", kStateFile));
  }
  for (const auto& [name, entry] : files->items()) {
    int64_t bytes = 0;
    std::string crc;
    if (!IsPlainFileName(name) || !IntegerField(entry, "bytes", &bytes) ||
        !StringField(entry, "crc32c", &crc)) {
      return Damaged(manifest_path, "has a malformed \"files\" entry");
    }
    const std::string path = absl::StrCat(where, "/", name);
    absl::StatusOr<FileChecksum> sum = Crc32cOfFile(path);
    if (absl::IsNotFound(sum.status())) return Damaged(path, "is missing");
    if (!sum.ok()) return Damaged(path, sum.status().message());
    if (sum->bytes != bytes) {
      return Damaged(path, absl::StrCat("holds ", sum->bytes, " bytes where its manifest recorded ",
                                        bytes, " (truncated or overwritten after the save)"));
    }
    if (Crc32cHex(sum->crc32c) != crc) {
      return Damaged(path, absl::StrCat("its CRC-32C is ", Crc32cHex(sum->crc32c),
                                        " where its manifest recorded ", crc,
                                        ": the content changed after the save"));
    }
  }
  return absl::OkStatus();
}

// Checks the step as a whole and each part; returns the parts' manifests.
absl::StatusOr<std::vector<Json>> VerifyStep(const std::string& dir, int64_t step,
                                             const std::vector<RolePart>& parts) {
  const std::string step_dir = StepDirectory(dir, step);
  if (!IsDirectory(step_dir)) return Damaged(step_dir, "is missing");
  const std::string commit = CommitPath(dir, step);
  const bool committed = PathExists(commit);
  std::optional<CheckpointWriter> committed_by;
  if (committed) {
    absl::StatusOr<std::string> text = ReadFileToString(commit, 1 << 20);
    if (!text.ok()) return Damaged(commit, text.status().message());
    const Json record = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    int64_t recorded = 0;
    if (!IntegerField(record, "step", &recorded) || recorded != step) {
      return Damaged(commit, absl::StrCat("is not a commit record of step ", step));
    }
    committed_by = WrittenBy(record);
  }
  std::vector<Json> manifests;
  for (const RolePart& part : parts) {
    ASSIGN_OR_RETURN(Json manifest, VerifyRoleState(dir, step, part.role, part.rank));
    int64_t version = 0;
    IntegerField(manifest, "version", &version);
    // A version-1 save predates commit records: `latest` or the caller named it.
    if (version >= 2 && !committed) {
      return Damaged(commit,
                     absl::StrCat("is missing: step ", step, " was saved but never committed"));
    }
    const std::optional<CheckpointWriter> saved_by = WrittenBy(manifest);
    if (committed_by && saved_by && !SameAttempt(*committed_by, *saved_by)) {
      return Damaged(
          absl::StrCat(RankDirectory(dir, step, part.role, part.rank), "/", kManifestName),
          absl::StrCat("was saved by ", AttemptName(*saved_by), " but step ", step,
                       " was committed by ", AttemptName(*committed_by),
                       ": another attempt's or job's worker wrote it after the commit"));
    }
    manifests.push_back(std::move(manifest));
  }
  return manifests;
}

// Copies step `step` into `parts` once every part's file parsed and fits.
absl::StatusOr<std::vector<Json>> CopyStep(const std::string& dir, int64_t step,
                                           const std::vector<RolePart>& parts,
                                           const std::vector<Json>& manifests) {
  std::vector<model::StateDict> saved;
  for (const RolePart& part : parts) {
    const std::string path =
        absl::StrCat(RankDirectory(dir, step, part.role, part.rank), "/", kStateFile);
    absl::StatusOr<model::StateDict> loaded = model::StateDict::Load(path);
    // A version-1 save has no CRC: a damaged header shows here.
    if (!loaded.ok()) return Damaged(path, loaded.status().message());
    saved.push_back(*std::move(loaded));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string where = RankDirectory(dir, step, parts[i].role, parts[i].rank);
    const auto& state = parts[i].state;
    if (saved[i].size() != state.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " holds ", saved[i].size(), " tensors and this rank's state has ",
                       state.size(), ": the checkpoint was saved with another model or layout"));
    }
    for (const auto& [name, tensor] : state) {
      absl::StatusOr<at::Tensor> value = saved[i].Get(name);
      if (!value.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": no tensor ", name, " (saved with another model or layout)"));
      }
      if (value->sizes() != tensor.sizes() || value->scalar_type() != tensor.scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", name, " is ", model::ShapeString(value->sizes()), " ",
            c10::toString(value->scalar_type()), ", this rank's is ",
            model::ShapeString(tensor.sizes()), " ", c10::toString(tensor.scalar_type())));
      }
    }
  }
  at::NoGradGuard no_grad;
  std::vector<Json> extras;
  for (size_t i = 0; i < parts.size(); ++i) {
    for (const auto& [name, tensor] : parts[i].state) {
      at::Tensor target = tensor;
      target.copy_(*saved[i].Get(name));
    }
    const Json* extra = Field(manifests[i], "extra");
    extras.push_back(extra != nullptr && extra->is_object() ? *extra : Json::object());
  }
  return extras;
}

}  // namespace

std::string StepName(int64_t step) { return absl::StrCat("step_", step); }

std::string RankPartName(int64_t step, const std::string& role, int rank) {
  return absl::StrCat(StepName(step), "/", role, "/rank_", rank);
}

std::string CommitRecordName(int64_t step) { return absl::StrCat(StepName(step), "/commit.json"); }

int64_t StepOfName(absl::string_view name) {
  int64_t step = 0;
  if (!absl::ConsumePrefix(&name, "step_") || !absl::SimpleAtoi(name, &step) || step < 1) return -1;
  return step;
}

ReadCheckpointFile ReadFromDirectory(const std::string& dir) {
  return [dir](const std::string& relative) -> absl::StatusOr<std::string> {
    const std::string path = absl::StrCat(dir, "/", relative);
    if (!PathExists(path)) return absl::NotFoundError(absl::StrCat(path, " is missing"));
    return ReadFileToString(path, 1 << 20);
  };
}

absl::Status CheckNotLeftBehind(const CheckpointWriter& writer, int64_t step,
                                const ReadCheckpointFile& read) {
  std::vector<int64_t> steps = {step};
  const absl::StatusOr<std::string> latest = read(kLatestName);
  if (latest.ok()) {
    const int64_t named = StepOfName(absl::StripAsciiWhitespace(*latest));
    if (named > 0 && named != step) steps.push_back(named);
  } else if (!absl::IsNotFound(latest.status())) {
    return latest.status();
  }
  for (const int64_t committed : steps) {
    const absl::StatusOr<std::string> text = read(CommitRecordName(committed));
    if (absl::IsNotFound(text.status())) continue;
    RETURN_IF_ERROR(text.status());
    const std::optional<CheckpointWriter> by =
        WrittenBy(Json::parse(*text, nullptr, /*allow_exceptions=*/false));
    if (by && SameJob(*by, writer) && by->attempt > writer.attempt) {
      return absl::FailedPreconditionError(
          absl::StrCat(AttemptName(writer), " was left behind: step ", committed,
                       " was committed by its attempt ", by->attempt,
                       " (this worker was cut off while the job moved on), so nothing of step ",
                       step, " is written"));
    }
  }
  return absl::OkStatus();
}

std::string StepDirectory(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/", StepName(step));
}

std::string RankDirectory(const std::string& dir, int64_t step, const std::string& role, int rank) {
  return absl::StrCat(dir, "/", RankPartName(step, role, rank));
}

absl::StatusOr<std::vector<std::string>> ManifestFileNames(const std::string& manifest_text) {
  const Json manifest = Json::parse(manifest_text, nullptr, /*allow_exceptions=*/false);
  const Json* files = Field(manifest, "files");
  if (files == nullptr || !files->is_object()) {
    return absl::DataLossError("the manifest lists no files");
  }
  std::vector<std::string> names;
  for (const auto& [name, entry] : files->items()) {
    if (!IsPlainFileName(name)) {
      return absl::DataLossError(absl::StrCat("the manifest lists the file '", name, "'"));
    }
    names.push_back(name);
  }
  return names;
}

absl::StatusOr<int64_t> SaveRoleState(const std::string& dir, int64_t step, const std::string& role,
                                      int rank, const train::TrainedModel::NamedTensors& state,
                                      const nlohmann::json& extra, const CheckpointWriter& writer) {
  const std::string where = RankDirectory(dir, step, role, rank);
  // Never a checkpoint that holds NaN or infinities (a resume from it can only diverge): checked
  // before anything is written, so `latest` keeps naming the last good one.
  std::vector<at::Tensor> values;
  for (const auto& [name, tensor] : state) values.push_back(tensor);
  if (const std::optional<size_t> bad = train::FirstNonFinite(values)) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": ", state[*bad].first, " holds non-finite values (NaN or infinity); step ", step,
        " is not saved and `latest` still names the last good checkpoint"));
  }
  RETURN_IF_ERROR(CheckNotLeftBehind(writer, step, ReadFromDirectory(dir)));
  RETURN_IF_ERROR(RemoveTree(CommitPath(dir, step)));
  RETURN_IF_ERROR(RemoveTree(where));
  RETURN_IF_ERROR(MakeDirectories(where));
  absl::StatusOr<int64_t> bytes = WritePart(where, step, role, rank, state, extra, writer);
  if (!bytes.ok()) {
    if (const absl::Status removed = RemoveTree(where); !removed.ok()) {
      RLOG(WARNING) << "could not remove the partial save " << where << ": " << removed.message();
    }
  }
  return bytes;
}

absl::Status CommitStep(const std::string& dir, int64_t step, const CheckpointWriter& writer) {
  const std::string step_dir = StepDirectory(dir, step);
  if (!IsDirectory(step_dir)) {
    return absl::FailedPreconditionError(absl::StrCat("commit: ", step_dir, " was not saved"));
  }
  RETURN_IF_ERROR(CheckNotLeftBehind(writer, step, ReadFromDirectory(dir)));
  Json parts = Json::array();
  ASSIGN_OR_RETURN(const std::vector<std::string> roles, ListDirectory(step_dir));
  for (const std::string& role : roles) {
    const std::string role_dir = absl::StrCat(step_dir, "/", role);
    if (!IsDirectory(role_dir)) continue;
    ASSIGN_OR_RETURN(const std::vector<std::string> ranks, ListDirectory(role_dir));
    for (const std::string& rank : ranks) {
      if (!absl::StartsWith(rank, "rank_")) continue;  // actor/huggingface, the export
      const std::string manifest = absl::StrCat(role_dir, "/", rank, "/", kManifestName);
      if (!PathExists(manifest)) {
        return absl::FailedPreconditionError(absl::StrCat("commit: ", manifest,
                                                          " is missing: that rank's save of step ",
                                                          step, " did not finish"));
      }
      ASSIGN_OR_RETURN(const std::string text, ReadFileToString(manifest, 1 << 20));
      const std::optional<CheckpointWriter> saved_by =
          WrittenBy(Json::parse(text, nullptr, /*allow_exceptions=*/false));
      // Another job's part (a directory a new job resumes from) is not this job's to judge. One
      // of another attempt is a left-behind worker's, written after this attempt saved: ABORTED,
      // a fault, so the job recovers and saves the step again rather than fail.
      if (saved_by && SameJob(*saved_by, writer) && saved_by->attempt != writer.attempt) {
        return absl::AbortedError(
            absl::StrCat("commit: ", manifest, " was saved by ", AttemptName(*saved_by),
                         ", not by ", AttemptName(writer), " that commits step ", step,
                         " (a worker the job left behind wrote it); the step is not committed"));
      }
      parts.push_back(absl::StrCat(role, "/", rank));
    }
  }
  if (parts.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit: ", step_dir, " holds no rank's save"));
  }
  const Json record = {
      {"version", kCommitVersion}, {"step", step},
      {"job_id", writer.job_id},   {"job_submit_time_ms", writer.job_submit_time_ms},
      {"attempt", writer.attempt}, {"parts", parts}};
  RETURN_IF_ERROR(WriteFileAtomically(CommitPath(dir, step), record.dump(1)));
  return WriteFileAtomically(absl::StrCat(dir, "/", kLatestName),
                             absl::StrCat("step_", step, "\n"));
}

int64_t OldestKeptStep(std::vector<int64_t> committed_steps, int64_t committed, int keep) {
  std::sort(committed_steps.rbegin(), committed_steps.rend());
  int64_t oldest_kept = committed;
  int kept = 1;
  for (const int64_t step : committed_steps) {
    if (kept >= keep) break;
    if (step >= committed) continue;
    oldest_kept = step;
    ++kept;
  }
  return oldest_kept;
}

absl::StatusOr<std::vector<std::string>> RemoveOldSteps(const std::string& dir, int64_t committed,
                                                        int keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  const int64_t oldest_kept = OldestKeptStep(CommittedSteps(dir), committed, keep);
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDirectory(dir));
  for (const std::string& name : names) {
    const int64_t step = StepOfName(name);
    if (step < 1 || step >= oldest_kept) continue;
    RETURN_IF_ERROR(RemoveTree(CommitPath(dir, step)));
    RETURN_IF_ERROR(RemoveTree(StepDirectory(dir, step)));
    removed.push_back(StepDirectory(dir, step));
  }
  return removed;
}

absl::StatusOr<nlohmann::json> VerifyRoleState(const std::string& dir, int64_t step,
                                               const std::string& role, int rank) {
  const std::string where = RankDirectory(dir, step, role, rank);
  if (!IsDirectory(StepDirectory(dir, step)))
    return Damaged(StepDirectory(dir, step), "is missing");
  if (!IsDirectory(where)) return Damaged(where, "is missing");
  const std::string manifest_path = absl::StrCat(where, "/", kManifestName);
  if (!PathExists(manifest_path)) {
    return Damaged(manifest_path, absl::StrCat("is missing (this rank's save of step ", step,
                                               " did not finish, or the file was removed)"));
  }
  absl::StatusOr<std::string> text = ReadFileToString(manifest_path, 1 << 20);
  if (!text.ok()) return Damaged(manifest_path, text.status().message());
  const Json manifest = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  int64_t version = 0, saved_step = 0;
  if (!manifest.is_object() || !IntegerField(manifest, "version", &version) || version < 1 ||
      version > kManifestVersion || !IntegerField(manifest, "step", &saved_step) ||
      saved_step != step) {
    return Damaged(manifest_path, absl::StrCat("is not a manifest of step ", step));
  }
  if (version >= 2) {
    std::string self_crc;
    if (!StringField(manifest, kSelfCrcKey, &self_crc) || SelfCrc(manifest) != self_crc) {
      return Damaged(manifest_path, "does not match its own CRC-32C: it changed after the save");
    }
    RETURN_IF_ERROR(VerifyFiles(where, manifest));
  }
  return manifest;
}

absl::StatusOr<LoadedCheckpoint> LoadNewestIntact(const std::string& dir, int64_t step,
                                                  const std::vector<RolePart>& parts) {
  LoadedCheckpoint loaded;
  std::set<int64_t, std::greater<int64_t>> candidates;
  if (step > 0) {
    candidates.insert(step);
  } else if (absl::StatusOr<int64_t> latest = LatestStep(dir); latest.ok()) {
    candidates.insert(*latest);
  } else if (!absl::IsNotFound(latest.status())) {
    loaded.passed_over.push_back(std::string(latest.status().message()));
  }
  for (const int64_t committed : CommittedSteps(dir)) {
    if (step <= 0 || committed < step) candidates.insert(committed);
  }
  if (candidates.empty() && loaded.passed_over.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  }
  for (const int64_t candidate : candidates) {
    absl::StatusOr<std::vector<Json>> extras = VerifyStep(dir, candidate, parts);
    if (extras.ok()) extras = CopyStep(dir, candidate, parts, *extras);
    if (extras.ok()) {
      loaded.step = candidate;
      loaded.extras = *std::move(extras);
      for (const std::string& note : loaded.passed_over) RLOG(WARNING) << "passed over " << note;
      return loaded;
    }
    if (!absl::IsDataLoss(extras.status())) return extras.status();
    loaded.passed_over.push_back(absl::StrCat("step ", candidate, ": ", extras.status().message()));
  }
  return absl::DataLossError(
      absl::StrCat("no intact checkpoint in ", dir, ": ", absl::StrJoin(loaded.passed_over, "; "),
                   ". Restore the files named, or start afresh (trainer.resume: false, or another "
                   "trainer.checkpoint_dir)."));
}

}  // namespace rlhfd::roles

// Checkpoints of a job's trained roles. Under the checkpoint directory:
//   step_<N>/<role>/rank_<r>/state.safetensors  the rank's training state (parameters or shards,
//                                               optimiser moments, step counts)
//   step_<N>/<role>/rank_<r>/manifest.json      written last by the rank: the step, what the
//                                               state holds, and each file's size and CRC-32C
//   step_<N>/commit.json                        written by world rank 0 once every rank saved:
//                                               the step is committed
//   latest                                      "step_<N>": the newest committed step, replaced
//                                               after commit.json
// Every file is written to a temporary name, fsynced and renamed, so a crash leaves whole files.
// A load checks before it copies anything: the step is committed, this rank's files are there
// with the size and CRC its manifest recorded, and the header parses. A step failing a check is
// passed over (its file named, with what is wrong) for the newest committed step before it; the
// load fails only when no step is intact. Manifests of version 1 (saved before checksums and
// commit records) load when `latest` or the caller names their step, without a CRC check.
//
// Manifests and commit records name the job attempt that wrote them. A worker the job has left
// behind (an older attempt of the same job, cut off by a partition that its cancellation did not
// cross) is fenced: its saves and commits are refused once a later attempt of its job committed
// the step `latest` names or the step itself; a commit that finds a part of another attempt of
// its job is ABORTED (the job recovers and saves again); and a committed step holding a part
// that another attempt or job wrote (one that raced the check) is passed over at load, like a
// damaged one.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

std::string StepDirectory(const std::string& dir, int64_t step);
std::string RankDirectory(const std::string& dir, int64_t step, const std::string& role, int rank);

// The same pieces relative to the checkpoint directory, for a copy kept elsewhere
// (trainer.checkpoint_uri): "step_<N>", "step_<N>/<role>/rank_<r>", "step_<N>/commit.json".
std::string StepName(int64_t step);
std::string RankPartName(int64_t step, const std::string& role, int rank);
std::string CommitRecordName(int64_t step);
inline constexpr char kLatestName[] = "latest";
inline constexpr char kManifestName[] = "manifest.json";
// The files of a rank's part its manifest lists, besides the manifest (which a copy writes
// last). DATA_LOSS when the text is no manifest of ours.
absl::StatusOr<std::vector<std::string>> ManifestFileNames(const std::string& manifest_text);
// "step_<N>" → N; -1 for any other name.
int64_t StepOfName(absl::string_view name);

// Who writes a checkpoint: a job, told apart from another controller's job of the same id by
// its submission time, and the job's attempt.
struct CheckpointWriter {
  std::string job_id;
  int64_t job_submit_time_ms = 0;
  int64_t attempt = 0;
};

// A file of the checkpoint layout by its name relative to the checkpoint directory ("latest",
// "step_3/commit.json"), from the directory or from a copy elsewhere; NOT_FOUND when absent.
using ReadCheckpointFile = std::function<absl::StatusOr<std::string>(const std::string& relative)>;
ReadCheckpointFile ReadFromDirectory(const std::string& dir);

// FAILED_PRECONDITION when `writer` is an attempt its job has left behind: the step `latest`
// names, or `step`, was committed by a later attempt of the same job. Another job's commits
// (a new job resuming from this directory) do not fence.
absl::Status CheckNotLeftBehind(const CheckpointWriter& writer, int64_t step,
                                const ReadCheckpointFile& read);

// Writes this rank's part of `step` for `writer`: the state, then the manifest (with `extra`
// under "extra"). A save of the same step before this one (cut short, or of a run a resume
// passed over) goes first: the step's commit record, so the step is not taken as committed while
// it is rewritten, and this rank's files. When the save fails its files are removed (a full disk
// keeps no partial shard). FAILED_PRECONDITION, and nothing written, when a tensor holds NaN or
// infinity (naming it) or when `writer` was left behind (CheckNotLeftBehind). Returns the bytes
// of tensor data written.
absl::StatusOr<int64_t> SaveRoleState(const std::string& dir, int64_t step, const std::string& role,
                                      int rank, const train::TrainedModel::NamedTensors& state,
                                      const nlohmann::json& extra, const CheckpointWriter& writer);

// Commits `step` for `writer` once every rank saved it: checks each saved part has its manifest
// and that `writer` was not left behind; writes step_<N>/commit.json, then points <dir>/latest
// at it. ABORTED, committing nothing, when a part was saved by another attempt of `writer`'s job.
absl::Status CommitStep(const std::string& dir, int64_t step, const CheckpointWriter& writer);

// Retention after committing `committed`: keeps it and the `keep` - 1 newest committed steps
// before it, and deletes every step directory older than the oldest kept (committed or not);
// directories of later steps (left by a run a resume went back from) are not touched. `keep`
// <= 0 keeps everything. Each directory's commit record goes first, so a deletion cut short
// never leaves a half-deleted step that looks committed. Returns the directories deleted.
absl::StatusOr<std::vector<std::string>> RemoveOldSteps(const std::string& dir, int64_t committed,
                                                        int keep);

// The retention rule, for the directory and the bucket alike: after committing `committed`,
// steps older than the returned one go — it keeps `committed` and the `keep` - 1 newest of
// `committed_steps` (any order) before it.
int64_t OldestKeptStep(std::vector<int64_t> committed_steps, int64_t committed, int keep);

// Checks one rank's part of `step` without loading it: the step directory, the manifest, each
// file's size and CRC-32C. DATA_LOSS naming the file and what is wrong. Returns the manifest.
absl::StatusOr<nlohmann::json> VerifyRoleState(const std::string& dir, int64_t step,
                                               const std::string& role, int rank);

// One role this rank restores.
struct RolePart {
  std::string role;
  int rank = 0;  // the rank's position in the role's pool
  train::TrainedModel::NamedTensors state;
};

struct LoadedCheckpoint {
  int64_t step = 0;
  std::vector<nlohmann::json> extras;  // each part's manifest "extra", in the parts' order
  // Newer steps passed over, each "step <N>: <file>: <what is wrong>".
  std::vector<std::string> passed_over;
};

// Restores `parts` from the newest intact committed step at or below `step` (0: of all steps):
// `step` itself when it is given, or the step `latest` names, then the committed steps before
// it, newest first. NOT_FOUND when there is no checkpoint; DATA_LOSS naming every bad file when
// none is intact; INVALID_ARGUMENT (no fallback: every step would fail it) when an intact step's
// tensors do not fit `parts` (another model or layout). Tensors are copied only from a step
// whose every part passed its checks.
absl::StatusOr<LoadedCheckpoint> LoadNewestIntact(const std::string& dir, int64_t step,
                                                  const std::vector<RolePart>& parts);

}  // namespace rlhfd::roles

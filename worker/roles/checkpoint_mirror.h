// The copy of a job's checkpoints in S3-compatible storage (trainer.checkpoint_uri). The bucket
// holds the local layout (checkpoint.h) under the URI's prefix, and its `latest` is the commit
// point: each rank uploads its part of a step before its save answers, world rank 0 uploads the
// step's commit record and then `latest` after committing locally, so a save cut short anywhere
// (a rank killed mid-upload) leaves the bucket's `latest` at the step before. A load whose step
// the local directory lacks downloads this rank's part and the commit record first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/util/s3_uri.h"
#include "worker/net/s3_client.h"
#include "worker/roles/checkpoint.h"

namespace rlhfd::roles {

class CheckpointMirror {
 public:
  // The mirror of `uri` with credentials and endpoint from the environment; FAILED_PRECONDITION
  // naming trainer.checkpoint_uri and what is missing.
  // `cancelled` (the job attempt's) stops every transfer; `fault_hold`: fault drills (the
  // worker's --fault_hold_checkpoint_upload).
  static absl::StatusOr<std::shared_ptr<CheckpointMirror>> Open(
      const std::string& uri, std::shared_ptr<const std::atomic<bool>> cancelled,
      absl::Duration fault_hold = absl::ZeroDuration());
  CheckpointMirror(S3Location location, net::S3Options options,
                   absl::Duration fault_hold = absl::ZeroDuration());

  // This rank's part of `step`, from `dir`: its data files, then its manifest. Refused when the
  // bucket shows `writer` was left behind (checkpoint.h's CheckNotLeftBehind).
  absl::Status UploadPart(const std::string& dir, int64_t step, const std::string& role, int rank,
                          const CheckpointWriter& writer);
  // Every file under <dir>/<relative> (an export beside a step: actor/huggingface).
  absl::Status UploadTree(const std::string& dir, const std::string& relative);
  // After the local commit of `step`: its commit record, then `latest`; refused, as UploadPart,
  // when `writer` was left behind.
  absl::Status UploadCommit(const std::string& dir, int64_t step, const CheckpointWriter& writer);
  // The step the bucket's `latest` names; NOT_FOUND when there is none.
  absl::StatusOr<int64_t> LatestStep();
  // Makes <dir> hold this rank's part of `step` and its commit record, downloading what the
  // local copy lacks (the manifest last, so an interrupted download is never a part).
  absl::Status EnsurePart(const std::string& dir, int64_t step, const std::string& role, int rank);
  // Retention in the bucket after committing `committed` (trainer.max_ckpt_to_keep `keep`; <= 0
  // keeps all), from the bucket's own steps as RemoveOldSteps does from the directory's: keeps
  // `committed` and the `keep` - 1 newest committed steps before it and deletes every step older
  // than the oldest kept (each commit record first: a step half deleted never looks committed).
  // Returns the steps deleted.
  absl::StatusOr<std::vector<int64_t>> RemoveOldSteps(int64_t committed, int keep);

  std::string Describe(const std::string& relative) const;

 private:
  std::string Key(const std::string& relative) const { return S3Key(location_, relative); }
  // CheckNotLeftBehind against the bucket's `latest` and commit records.
  absl::Status CheckNotLeftBehind(const CheckpointWriter& writer, int64_t step);

  S3Location location_;
  std::shared_ptr<const std::atomic<bool>> cancelled_;  // the job attempt's
  net::S3Client client_;
  absl::Duration fault_hold_;
};

}  // namespace rlhfd::roles

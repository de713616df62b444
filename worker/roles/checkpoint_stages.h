// The stages over a job's trained state and device memory: save, commit and load checkpoints
// (checkpoint.h holds the files), and offload roles to the host and back. Each works on the
// hosted job's roles through HostedRole / TrainedRole, not by role name.
#pragma once

#include <ATen/Device.h>

#include "absl/status/statusor.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/roles/hosted_job.h"

namespace rlhfd::roles {

// This rank's part of the step's checkpoint (every trained role it hosts); with
// export_huggingface the actor's full weights too, written by the actor pool's first rank.
// request.background: the parts are copied to host memory and written on a thread
// (BackgroundSave; `fault_hold` is its hold), after world rank 0 there commits
// request.commit_step; request.finish_background waits for that thread. A save still in flight when
// another starts, or a checkpoint loads, is waited for and dropped: only a finished save is ever
// committed.
absl::StatusOr<v1::CheckpointReply> RunSaveCheckpoint(
    HostedJob& job, const v1::CheckpointRequest& request,
    absl::Duration fault_hold = absl::ZeroDuration());
// Commits the step (world rank 0, once every rank saved), then applies
// trainer.max_ckpt_to_keep.
absl::StatusOr<v1::CheckpointReply> RunCommitCheckpoint(HostedJob& job,
                                                        const v1::CheckpointRequest& request);
// Restores the newest intact committed step at or below request.step, and clears the job's
// poisoned state, stored replies and batch.
absl::StatusOr<v1::CheckpointReply> RunLoadCheckpoint(HostedJob& job,
                                                      const v1::CheckpointRequest& request);
// Moves the named roles' device tensors to the host (pinned when the device is a GPU) or back
// to `device`.
absl::StatusOr<v1::OffloadReply> RunOffload(HostedJob& job, const v1::OffloadRequest& request,
                                            const at::Device& device);

}  // namespace rlhfd::roles

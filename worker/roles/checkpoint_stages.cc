#include "worker/roles/checkpoint_stages.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging/logging.h"
#include "common/stages/role_names.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "nlohmann/json.hpp"
#include "worker/model/lora.h"
#include "worker/model/model_export.h"
#include "worker/roles/checkpoint.h"
#include "worker/roles/checkpoint_mirror.h"

namespace rlhfd::roles {
namespace {

// A manifest's "extra" values (its CRC was checked; a version-1 manifest's was not).
int64_t JsonInteger(const nlohmann::json& object, const char* key, int64_t fallback) {
  const auto found = object.find(key);
  return found != object.end() && found->is_number_integer() ? found->get<int64_t>() : fallback;
}
double JsonNumber(const nlohmann::json& object, const char* key, double fallback) {
  const auto found = object.find(key);
  return found != object.end() && found->is_number() ? found->get<double>() : fallback;
}

absl::Status CheckCheckpointDirectory(const HostedJob& job, const std::string& requested) {
  return CheckConfiguredDirectory(requested, job.spec.trainer().checkpoint_dir(),
                                  "trainer.checkpoint_dir");
}

// The actor's full weights as a Hugging Face directory beside the step's checkpoint (merged, for
// a LoRA actor, whose adapters also go beside it as a PEFT directory). Gathering sharded
// weights is a collective: every actor rank takes part, the first writes.
absl::Status ExportActor(HostedJob& job, const v1::CheckpointRequest& request, int position) {
  ASSIGN_OR_RETURN(model::Transformer full, job.actor->FullWeights());
  if (position == 0) {
    const std::string actor_dir =
        absl::StrCat(StepDirectory(request.directory(), request.step()), "/actor");
    RETURN_IF_ERROR(model::ExportHuggingFaceDirectory(full, job.spec.model().path(),
                                                      actor_dir + "/huggingface", at::kBFloat16));
    std::vector<std::string> exported = {"huggingface"};
    if (const std::optional<model::LoraOptions>& lora = job.actor->lora()) {
      RETURN_IF_ERROR(model::WritePeftAdapter(job.actor->trained().module(), *lora,
                                              job.spec.model().path(),
                                              actor_dir + "/lora_adapter"));
      exported.push_back("lora_adapter");
    }
    if (job.checkpoint_mirror) {
      for (const std::string& name : exported) {
        RETURN_IF_ERROR(job.checkpoint_mirror->UploadTree(
            request.directory(), absl::StrCat(StepName(request.step()), "/actor/", name)));
      }
    }
  }
  job.actor->ReleaseRollout();
  return absl::OkStatus();
}

// The job attempt a checkpoint call belongs to: its files name it, and a later one fences it.
CheckpointWriter WriterOf(const v1::CheckpointRequest& request) {
  return {.job_id = request.key().job_id(),
          .job_submit_time_ms = request.job_submit_time_ms(),
          .attempt = request.key().attempt()};
}

// Commits `step` for `writer` (and, with trainer.checkpoint_uri, uploads its commit: its failure is
// the commit's), then applies trainer.max_ckpt_to_keep (`keep`) here and in the bucket. The commit
// stands whatever happens to the deletion of older steps; a failed one is tried again after the
// next commit.
absl::Status CommitWithRetention(const std::string& dir, int64_t step, int keep,
                                 const CheckpointWriter& writer, CheckpointMirror* mirror) {
  RETURN_IF_ERROR(CommitStep(dir, step, writer));
  if (mirror != nullptr) RETURN_IF_ERROR(mirror->UploadCommit(dir, step, writer));
  const absl::StatusOr<std::vector<std::string>> removed = RemoveOldSteps(dir, step, keep);
  if (!removed.ok()) {
    RLOG(WARNING) << "trainer.max_ckpt_to_keep: " << removed.status().message();
  } else if (!removed->empty()) {
    RLOG(INFO) << "trainer.max_ckpt_to_keep " << keep << ": deleted "
               << absl::StrJoin(*removed, ", ");
  }
  if (mirror == nullptr) return absl::OkStatus();
  const absl::StatusOr<std::vector<int64_t>> removed_there = mirror->RemoveOldSteps(step, keep);
  if (!removed_there.ok()) {
    RLOG(WARNING) << removed_there.status().message();
  } else if (!removed_there->empty()) {
    RLOG(INFO) << "trainer.max_ckpt_to_keep " << keep << ": deleted steps "
               << absl::StrJoin(*removed_there, ", ") << " from " << mirror->Describe("");
  }
  return absl::OkStatus();
}

// With trainer.checkpoint_uri, the files of the step a load would take that this rank lacks:
// the step asked for, or the bucket's latest (whichever is older), when the local directory has
// not committed it (a new machine, a lost disk). Nothing when the bucket holds no checkpoint.
// When the bucket cannot be read, a directory with committed steps of its own loads from them
// (logged); one without fails the load, which would otherwise start the job afresh.
absl::Status FetchFromMirror(HostedJob& job, const std::string& dir, int64_t step,
                             const std::vector<RolePart>& parts) {
  if (step > 0 && PathExists(absl::StrCat(dir, "/", CommitRecordName(step)))) {
    return absl::OkStatus();
  }
  absl::Status fetched = [&]() -> absl::Status {
    absl::StatusOr<int64_t> latest = job.checkpoint_mirror->LatestStep();
    if (absl::IsNotFound(latest.status())) return absl::OkStatus();
    RETURN_IF_ERROR(latest.status());
    const int64_t wanted = step > 0 ? std::min(step, *latest) : *latest;
    for (const RolePart& part : parts) {
      RETURN_IF_ERROR(job.checkpoint_mirror->EnsurePart(dir, wanted, part.role, part.rank));
    }
    return absl::OkStatus();
  }();
  if (fetched.ok() || !PathExists(absl::StrCat(dir, "/", kLatestName))) return fetched;
  RLOG(WARNING) << fetched.message() << "; loading from " << dir << " alone";
  return absl::OkStatus();
}

// The save in flight, waited for; its outcome is no longer anyone's to commit.
void DropBackgroundSave(HostedJob& job) {
  if (!job.background_save) return;
  const absl::StatusOr<int64_t> written = job.background_save->Wait();
  RLOG(INFO) << "the background save of step " << job.background_save->step()
             << " is dropped uncommitted"
             << (written.ok() ? std::string() : absl::StrCat(": ", written.status().message()));
  job.background_save.reset();
}

absl::StatusOr<v1::CheckpointReply> FinishBackgroundSave(HostedJob& job,
                                                         const v1::CheckpointRequest& request) {
  if (!job.background_save || job.background_save->step() != request.step()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no background save of step ", request.step(),
        " is in flight on this rank (it was dropped: a later save or a load came first)"));
  }
  const absl::StatusOr<int64_t> written = job.background_save->Wait();
  job.background_save.reset();
  if (!written.ok()) {
    return absl::Status(written.status().code(),
                        absl::StrCat("the background save of step ", request.step(),
                                     " failed: ", written.status().message()));
  }
  v1::CheckpointReply reply;
  reply.set_step(request.step());
  reply.set_bytes(*written);
  return reply;
}

}  // namespace

absl::StatusOr<v1::CheckpointReply> RunSaveCheckpoint(HostedJob& job,
                                                      const v1::CheckpointRequest& request,
                                                      absl::Duration fault_hold) {
  RETURN_IF_ERROR(CheckCheckpointDirectory(job, request.directory()));
  if (request.step() < 1) return absl::InvalidArgumentError("checkpoint: step must be >= 1");
  if (request.finish_background()) return FinishBackgroundSave(job, request);
  if (request.background() && request.export_huggingface()) {
    return absl::InvalidArgumentError("checkpoint: an export is written in the foreground");
  }
  DropBackgroundSave(job);  // one write at a time
  v1::CheckpointReply reply;
  reply.set_step(request.step());
  std::vector<BackgroundSave::Part> parts;
  for (auto& [role, trained] : job.TrainedRoles()) {
    const int position = job.layout->PositionIn(role);
    parts.push_back({.role = stages::RoleName(role),
                     .rank = position,
                     .state = trained->trained().StateTensors(),
                     .extra = {{"optimizer_steps", trained->optimizer_steps()},
                               {"nonfinite_skips", trained->nonfinite_skips()},
                               {"seed", job.spec.trainer().seed()},
                               {"kl_coef", request.kl_coef()}}});
    reply.set_path(RankDirectory(request.directory(), request.step(), parts.back().role, position));
  }
  std::shared_ptr<CheckpointMirror> mirror = job.checkpoint_mirror;
  const CheckpointWriter writer = WriterOf(request);
  if (request.background()) {
    BackgroundSave::Around around{.hold = fault_hold};
    if (request.commit_step() > 0 && job.world->rank() == 0) {
      // The job's progress names the step before this commit until the next save confirms it,
      // so retention keeps one step more: a recovery in between finds the step it loads.
      const int keep = job.spec.trainer().max_ckpt_to_keep();
      around.first = [dir = request.directory(), step = request.commit_step(),
                      keep = keep > 0 ? keep + 1 : 0, writer, mirror] {
        return CommitWithRetention(dir, step, keep, writer, mirror.get());
      };
    }
    if (mirror) {
      around.then = [dir = request.directory(), step = request.step(), writer,
                     mirror](const BackgroundSave::Part& part) {
        return mirror->UploadPart(dir, step, part.role, part.rank, writer);
      };
    }
    job.background_save = BackgroundSave::Start(request.directory(), request.step(), writer,
                                                std::move(parts), std::move(around));
    return reply;
  }
  for (const BackgroundSave::Part& part : parts) {
    ASSIGN_OR_RETURN(const int64_t bytes,
                     SaveRoleState(request.directory(), request.step(), part.role, part.rank,
                                   part.state, part.extra, writer));
    reply.set_bytes(reply.bytes() + bytes);
    if (mirror) {
      RETURN_IF_ERROR(
          mirror->UploadPart(request.directory(), request.step(), part.role, part.rank, writer));
    }
  }
  if (request.export_huggingface() && job.actor) {
    RETURN_IF_ERROR(ExportActor(job, request, job.layout->PositionIn(v1::ROLE_ACTOR)));
  }
  return reply;
}

absl::StatusOr<v1::CheckpointReply> RunCommitCheckpoint(HostedJob& job,
                                                        const v1::CheckpointRequest& request) {
  RETURN_IF_ERROR(CheckCheckpointDirectory(job, request.directory()));
  RETURN_IF_ERROR(CommitWithRetention(request.directory(), request.step(),
                                      job.spec.trainer().max_ckpt_to_keep(), WriterOf(request),
                                      job.checkpoint_mirror.get()));
  v1::CheckpointReply reply;
  reply.set_step(request.step());
  reply.set_path(StepDirectory(request.directory(), request.step()));
  return reply;
}

absl::StatusOr<v1::CheckpointReply> RunLoadCheckpoint(HostedJob& job,
                                                      const v1::CheckpointRequest& request) {
  RETURN_IF_ERROR(CheckCheckpointDirectory(job, request.directory()));
  DropBackgroundSave(job);  // its files must not change under the load
  const std::vector<std::pair<v1::Role, TrainedRole*>> trained_roles = job.TrainedRoles();
  std::vector<RolePart> parts;
  for (auto& [role, trained] : trained_roles) {
    parts.push_back({.role = stages::RoleName(role),
                     .rank = job.layout->PositionIn(role),
                     .state = trained->trained().StateTensors()});
  }
  if (job.checkpoint_mirror) {
    RETURN_IF_ERROR(FetchFromMirror(job, request.directory(), request.step(), parts));
  }
  ASSIGN_OR_RETURN(const LoadedCheckpoint loaded,
                   LoadNewestIntact(request.directory(), request.step(), parts));
  v1::CheckpointReply reply;
  reply.set_step(loaded.step);
  for (const std::string& note : loaded.passed_over) reply.add_passed_over(note);
  for (size_t i = 0; i < parts.size(); ++i) {
    const v1::Role role = trained_roles[i].first;
    TrainedRole& trained = *trained_roles[i].second;
    const nlohmann::json& extra = loaded.extras[i];
    const int64_t steps = JsonInteger(extra, "optimizer_steps", 0);
    reply.set_kl_coef(JsonNumber(extra, "kl_coef", job.spec.algorithm().kl().coef()));
    trained.set_optimizer_steps(steps);
    trained.set_nonfinite_skips(JsonInteger(extra, "nonfinite_skips", 0));
    trained.ReleaseDerived();
    if (role == v1::ROLE_ACTOR) {
      reply.set_optimizer_steps(steps);
    } else {
      reply.set_critic_optimizer_steps(steps);
    }
    reply.set_path(RankDirectory(request.directory(), loaded.step, parts[i].role, parts[i].rank));
  }
  job.poisoned.clear();
  job.replies.clear();
  job.batches.clear();
  RLOG(INFO) << "loaded step " << loaded.step << " from " << request.directory();
  return reply;
}

absl::StatusOr<v1::OffloadReply> RunOffload(HostedJob& job, const v1::OffloadRequest& request,
                                            const at::Device& device) {
  const at::Device target = request.to_host() ? at::Device(at::kCPU) : device;
  const bool pin = request.to_host() && device.is_cuda();
  for (const int name : request.roles()) {
    HostedRole* role = job.Role(static_cast<v1::Role>(name));
    if (role == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offload: this worker hosts no ", stages::RoleName(static_cast<v1::Role>(name))));
    }
    role->ReleaseDerived();
    for (at::Tensor& tensor : role->ResidentTensors()) {
      at::Tensor moved = tensor.to(target, /*non_blocking=*/false, /*copy=*/false);
      if (pin && !moved.is_pinned()) moved = moved.pin_memory();
      tensor.set_data(moved);
    }
  }
  return v1::OffloadReply();
}

}  // namespace rlhfd::roles

#include "worker/roles/batch_stages.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/algorithms/supervised.h"
#include "common/stages/response_samples.h"
#include "common/stages/role_names.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "worker/model/safetensors_writer.h"
#include "worker/parallel/transfer.h"
#include "worker/roles/advantage_stage.h"
#include "worker/roles/generated_rows.h"
#include "worker/roles/scored_generation.h"
#include "worker/roles/supervised_validation.h"
#include "worker/roles/weight_sync.h"

namespace rlhfd::roles {
namespace {

// ReMax's baseline: the greedy response's reward, for each of the prompt's rows.
absl::Status PutGreedyBaseline(HostedJob& job, const v1::GenerateRequest& request, int64_t n,
                               const at::Device& device) {
  if (!job.scorer) {
    return absl::FailedPreconditionError(
        "remax scores its greedy baseline with roles.reward.rule, .custom_reward_function or "
        ".remote");
  }
  ASSIGN_OR_RETURN(const std::vector<double> baseline,
                   GreedyBaseline(*job.actor, request, *job.scorer, job.cancelled.get()));
  const at::Tensor per_prompt = at::tensor(baseline, at::kDouble).to(at::kFloat);
  return job.BatchOf(request.key().step())
      .Put("reward_baselines", per_prompt.repeat_interleave(n).to(device).contiguous());
}

// Checks a move's shape against the step this rank holds, or (a receiver new to the step)
// begins it. The sending side must hold the step.
absl::Status BeginOrCheckMove(HostedJob& job, const v1::MoveTensorsRequest& request,
                              const RolePool& to, bool sends) {
  const int64_t rows = request.rows();
  const int64_t step = request.key().step();
  StepBatch& batch = job.BatchOf(step);
  const bool current = batch.begun() && batch.step() == step;
  if (current && (batch.total_rows() != rows || batch.prompt_length() != request.prompt_length() ||
                  batch.response_length() != request.response_length())) {
    return absl::InvalidArgumentError(
        absl::StrCat("move: step ", step, " has ", batch.total_rows(), " rows with P ",
                     batch.prompt_length(), " and R ", batch.response_length(), ", not ", rows,
                     ", ", request.prompt_length(), ", ", request.response_length()));
  }
  if (current) return absl::OkStatus();
  if (sends) return NeedStepRows(batch, step, "move");
  if (rows < 1 || request.prompt_length() < 1 || request.response_length() < 1) {
    return absl::InvalidArgumentError("move: rows, prompt_length and response_length must be >= 1");
  }
  batch.Begin(step, rows, job.layout->RowsOf(to.role, rows), request.prompt_length(),
              request.response_length());
  return absl::OkStatus();
}

// Bytes of one row of `info` on the wire.
int64_t RowBytes(const TensorInfo& info, const std::vector<int64_t>& row_shape) {
  int64_t row_bytes = StepBatch::DtypeOf(info) == at::kLong ? 8 : 4;
  for (int64_t d : row_shape) row_bytes *= d;
  return row_bytes;
}

// The first `count` of this rank's responses as text (special tokens skipped), for the reward
// stage (all rows) and the logged samples (the first trainer.log_samples).
absl::StatusOr<std::vector<std::string>> DecodeResponses(const HostedJob& job,
                                                         const StepBatch& batch, int64_t count,
                                                         const char* stage) {
  ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", stage));
  ASSIGN_OR_RETURN(const at::Tensor all_lengths, batch.ResponseLengths(stage));
  const at::Tensor host_ids =
      ids.narrow(0, 0, count).narrow(1, batch.prompt_length(), batch.response_length()).cpu();
  // The whole trajectory, a multi-turn rollout's tool responses included (verl scores it so).
  const at::Tensor lengths = all_lengths.narrow(0, 0, count).cpu();
  std::vector<std::string> texts;
  texts.reserve(static_cast<size_t>(count));
  for (int64_t row = 0; row < count; ++row) {
    const int64_t length = lengths[row].item<int64_t>();
    const int64_t* data = host_ids[row].data_ptr<int64_t>();
    const std::vector<int32_t> tokens(data, data + length);
    texts.push_back(job.actor->tokenizer().Decode(tokens, /*skip_special_tokens=*/true));
  }
  return texts;
}

// This rank's rows among the step's first trainer.log_samples: prompt and response texts and the
// score every reward source leaves in the batch (rule, remote or the reward model's).
absl::Status AddStepSamples(const HostedJob& job, const StepBatch& batch,
                            v1::AdvantageReply& reply) {
  const int64_t first = batch.rows().begin;
  const int64_t count =
      std::min<int64_t>(batch.rows().size(), job.spec.trainer().log_samples() - first);
  if (count <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<std::string> responses,
                   DecodeResponses(job, batch, count, "advantages"));
  ASSIGN_OR_RETURN(const at::Tensor scores, batch.Get("scores", "advantages"));
  const at::Tensor host_scores = scores.narrow(0, 0, count).to(at::kDouble).cpu();
  for (int64_t row = 0; row < count; ++row) {
    *reply.add_samples() =
        stages::MakeResponseSample(first + row, batch.sources().at(row).prompt_text, responses[row],
                                   host_scores[row].item<double>(), /*validation=*/false);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::GenerateReply> RunGenerate(HostedJob& job, const v1::GenerateRequest& request,
                                              const at::Device& device,
                                              const std::atomic<int64_t>* queued_pool_calls) {
  // A rollout pool of its own generates; the actor's ranks then take their rows from it.
  const v1::Role generator = job.layout->Find(v1::ROLE_ROLLOUT) ? v1::ROLE_ROLLOUT : v1::ROLE_ACTOR;
  const bool adopts = request.rows_from_rollout_pool();
  if (adopts && generator != v1::ROLE_ROLLOUT) {
    return absl::InvalidArgumentError(
        "generate: rows_from_rollout_pool, but the job has no rollout pool (roles.rollout)");
  }
  const v1::Role role = adopts ? v1::ROLE_ACTOR : generator;
  RETURN_IF_ERROR(NeedRole(job, role, job.layout->Hosts(role)));
  const int64_t n = job.spec.roles().actor().rollout().n();
  if (request.total_prompts() < 1 || request.first_prompt() < 0 ||
      request.first_prompt() + request.prompts_size() > request.total_prompts()) {
    return absl::InvalidArgumentError(
        absl::StrCat("generate: prompts [", request.first_prompt(), ", ",
                     request.first_prompt() + request.prompts_size(),
                     ") are not within total_prompts ", request.total_prompts()));
  }
  const int64_t total_rows = request.total_prompts() * n;
  const RowRange rows = job.layout->RowsOf(role, total_rows);
  if (rows.begin != request.first_prompt() * n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generate: this rank's rows start at ", rows.begin, ", so its first prompt is ",
        rows.begin / n, ", not ", request.first_prompt()));
  }
  StepBatch& batch = job.BatchOf(request.key().step());
  if (adopts) {
    RETURN_IF_ERROR(
        AdoptRows(job.spec, job.actor->tokenizer(), job.actor->prompt_tools(), request, batch));
    return v1::GenerateReply();
  }
  if (generator == v1::ROLE_ROLLOUT) {
    return job.rollout->Generate(request, total_rows, rows, batch, queued_pool_calls);
  }
  ASSIGN_OR_RETURN(v1::GenerateReply reply, job.actor->Generate(request, total_rows, rows, batch));
  if (algorithms::NeedsGreedyBaseline(job.spec.algorithm())) {
    RETURN_IF_ERROR(PutGreedyBaseline(job, request, n, device));
  }
  return reply;
}

absl::StatusOr<v1::SyncWeightsReply> RunSyncWeights(HostedJob& job,
                                                    const v1::SyncWeightsRequest& request) {
  if (!job.weights_sync) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sync weights: rank ", job.layout->rank(),
        " is in no rollout pool's weights group (the job has no roles.rollout, or this rank is "
        "neither an actor nor a rollout rank)"));
  }
  const int64_t step = request.key().step();
  std::map<std::string, double> figures;
  if (job.actor) {
    ASSIGN_OR_RETURN(figures, job.weights_sync->Send(job.actor->trained(), step,
                                                     WeightSyncCheckDue(job.spec, step)));
  } else {
    RETURN_IF_ERROR(NeedRole(job, v1::ROLE_ROLLOUT, job.rollout != nullptr));
    ASSIGN_OR_RETURN(figures,
                     job.rollout->ReceiveWeights(*job.weights_sync, step, request.weights_step(),
                                                 job.rollout_weights_hook));
  }
  v1::SyncWeightsReply reply;
  reply.mutable_metrics()->insert(figures.begin(), figures.end());
  return reply;
}

absl::StatusOr<v1::MoveTensorsReply> RunMoveTensors(HostedJob& job,
                                                    const v1::MoveTensorsRequest& request,
                                                    const at::Device& device) {
  const RolePool* from = job.layout->Find(request.from_role());
  const RolePool* to = job.layout->Find(request.to_role());
  if (from == nullptr || to == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "move: the job has no ",
        stages::RoleName(from == nullptr ? request.from_role() : request.to_role()), " pool"));
  }
  const bool sends = job.layout->Hosts(request.from_role());
  const bool receives = job.layout->Hosts(request.to_role());
  if (!sends && !receives) {
    return absl::FailedPreconditionError(absl::StrCat("move: this rank is in neither the ",
                                                      stages::RoleName(from->role), " nor the ",
                                                      stages::RoleName(to->role), " pool"));
  }
  RETURN_IF_ERROR(BeginOrCheckMove(job, request, *to, sends));
  StepBatch& batch = job.BatchOf(request.key().step());
  const int rank = job.layout->rank();
  const parallel::TransferPlan plan =
      parallel::TransferPlan::Contiguous(request.rows(), from->ranks, to->ranks);
  v1::MoveTensorsReply reply;
  for (const std::string& name : request.tensors()) {
    ASSIGN_OR_RETURN(const TensorInfo info, CheckStepTensor(name));
    at::Tensor local;
    if (sends) {
      ASSIGN_OR_RETURN(local, batch.Get(name, "move"));
    }
    const std::vector<int64_t> row_shape = batch.RowShape(info);
    const at::TensorOptions options =
        at::TensorOptions().dtype(StepBatch::DtypeOf(info)).device(device);
    ASSIGN_OR_RETURN(at::Tensor moved,
                     parallel::ExecuteTransfer(*job.world, plan, local, row_shape, options));
    const int64_t row_bytes = RowBytes(info, row_shape);
    if (sends) {
      for (int64_t row : plan.SourceRows(rank)) {
        if (plan.destination[row] != rank) reply.set_bytes_sent(reply.bytes_sent() + row_bytes);
      }
    }
    if (receives) {
      for (int64_t row : plan.DestinationRows(rank)) {
        if (plan.source[row] != rank) {
          reply.set_bytes_received(reply.bytes_received() + row_bytes);
        }
      }
      RETURN_IF_ERROR(batch.Put(name, std::move(moved)));
    }
  }
  return reply;
}

absl::StatusOr<v1::ForwardReply> RunForward(HostedJob& job, const v1::ForwardRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  StepBatch& batch = job.BatchOf(request.key().step());
  RETURN_IF_ERROR(NeedStepRows(batch, request.key().step(), "forward"));
  v1::ForwardReply reply;
  switch (request.kind()) {
    case v1::FORWARD_KIND_OLD_LOG_PROBS: {
      RETURN_IF_ERROR(NeedRole(job, v1::ROLE_ACTOR, job.actor != nullptr));
      ASSIGN_OR_RETURN(const auto gap, job.actor->ComputeOldLogProbs(batch));
      reply.mutable_metrics()->insert(gap.begin(), gap.end());
      break;
    }
    case v1::FORWARD_KIND_REF_LOG_PROBS:
      RETURN_IF_ERROR(NeedRole(job, v1::ROLE_REFERENCE, job.reference != nullptr));
      RETURN_IF_ERROR(job.reference->ComputeLogProbs(batch));
      break;
    case v1::FORWARD_KIND_VALUES:
      RETURN_IF_ERROR(NeedRole(job, v1::ROLE_CRITIC, job.critic != nullptr));
      RETURN_IF_ERROR(job.critic->ComputeValues(batch));
      break;
    case v1::FORWARD_KIND_REWARD_SCORES:
      RETURN_IF_ERROR(NeedRole(job, v1::ROLE_REWARD, job.reward_model != nullptr));
      RETURN_IF_ERROR(job.reward_model->ComputeScores(batch));
      break;
    default:
      return absl::InvalidArgumentError("forward: kind is required");
  }
  (*reply.mutable_metrics())["forward_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return reply;
}

absl::StatusOr<v1::RewardReply> RunRewards(HostedJob& job, const v1::RewardRequest& request) {
  RETURN_IF_ERROR(NeedRole(job, v1::ROLE_ACTOR, job.actor != nullptr));
  if (!job.scorer) {
    return absl::FailedPreconditionError(
        "rewards: roles.reward.model scores with a REWARD_SCORES forward on the reward pool");
  }
  StepBatch& batch = job.BatchOf(request.key().step());
  RETURN_IF_ERROR(NeedStepRows(batch, request.key().step(), "rewards"));
  ASSIGN_OR_RETURN(std::vector<std::string> texts,
                   DecodeResponses(job, batch, batch.rows().size(), "rewards"));
  std::vector<ScoredResponse> responses;
  for (int64_t row = 0; row < batch.rows().size(); ++row) {
    const RowSource& source = batch.sources().at(row);
    responses.push_back({source.prompt_text, std::move(texts[row]), source.ground_truth_json,
                         source.data_source, source.extra_info_json});
  }
  ASSIGN_OR_RETURN(const std::vector<double> scores,
                   job.scorer->Score(responses, batch.rows().begin, job.cancelled.get()));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("response_mask", "rewards"));
  RETURN_IF_ERROR(batch.Put("scores", at::tensor(scores, at::kFloat).to(mask.device())));
  v1::RewardReply reply;
  double total = 0;
  for (double score : scores) {
    reply.add_scores(score);
    total += score;
  }
  (*reply.mutable_metrics())["score_sum"] = total;
  return reply;
}

absl::StatusOr<v1::AdvantageReply> RunAdvantages(HostedJob& job,
                                                 const v1::AdvantageRequest& request) {
  RETURN_IF_ERROR(NeedRole(job, v1::ROLE_ACTOR, job.actor != nullptr));
  StepBatch& batch = job.BatchOf(request.key().step());
  RETURN_IF_ERROR(NeedStepRows(batch, request.key().step(), "advantages"));
  ASSIGN_OR_RETURN(v1::AdvantageReply reply,
                   ComputeAdvantages(job.spec, request, batch, job.PoolOf(v1::ROLE_ACTOR)));
  RETURN_IF_ERROR(AddStepSamples(job, batch, reply));
  return reply;
}

absl::StatusOr<v1::UpdateReply> RunUpdateActor(HostedJob& job, const v1::UpdateRequest& request) {
  RETURN_IF_ERROR(NeedRole(job, v1::ROLE_ACTOR, job.actor != nullptr));
  ASSIGN_OR_RETURN(v1::UpdateReply reply,
                   job.actor->Update(request, job.BatchOf(request.key().step())));
  // What the rollout pool's next checked copy of these weights must report.
  if (job.weights_sync &&
      WeightSyncCheckDue(job.spec, FirstRolloutAfterUpdate(job.spec, request.key().step()))) {
    ASSIGN_OR_RETURN(const double checksum, job.weights_sync->TrainedChecksum(
                                                job.actor->trained(), job.PoolOf(v1::ROLE_ACTOR)));
    reply.mutable_metrics()->insert({std::string("weights_checksum"), checksum});
  }
  return reply;
}

absl::StatusOr<v1::UpdateReply> RunUpdateCritic(HostedJob& job, const v1::UpdateRequest& request) {
  RETURN_IF_ERROR(NeedRole(job, v1::ROLE_CRITIC, job.critic != nullptr));
  return job.critic->Update(request, job.BatchOf(request.key().step()));
}

absl::StatusOr<v1::ValidateReply> RunValidate(HostedJob& job, const v1::ValidateRequest& request) {
  RETURN_IF_ERROR(NeedRole(job, v1::ROLE_ACTOR, job.actor != nullptr));
  if (algorithms::ValidatesByLoss(job.spec)) return SupervisedValidation(*job.actor, request);
  if (!job.scorer) {
    return absl::UnimplementedError(
        "validate: validation scores with roles.reward.rule, .custom_reward_function or .remote; a "
        "reward model's "
        "validation is not supported yet");
  }
  return ValidateActor(*job.actor, request, *job.scorer, job.cancelled.get());
}

absl::StatusOr<v1::DumpBatchReply> RunDumpBatch(HostedJob& job,
                                                const v1::DumpBatchRequest& request) {
  RETURN_IF_ERROR(CheckConfiguredDirectory(
      request.directory(), job.spec.trainer().rollout_data_dir(), "trainer.rollout_data_dir"));
  const StepBatch& batch = job.BatchOf(request.key().step());
  RETURN_IF_ERROR(NeedStepRows(batch, request.key().step(), "dump"));
  RETURN_IF_ERROR(MakeDirectories(request.directory()));
  std::vector<std::pair<std::string, at::Tensor>> tensors(batch.tensors().begin(),
                                                          batch.tensors().end());
  const std::string path = absl::StrCat(request.directory(), "/step_", batch.step(), "_rank_",
                                        job.layout->rank(), ".safetensors");
  RETURN_IF_ERROR(
      model::WriteSafetensors(path, tensors,
                              {{"format", "pt"},
                               {"step", std::to_string(batch.step())},
                               {"total_rows", std::to_string(batch.total_rows())},
                               {"first_row", std::to_string(batch.rows().begin)},
                               {"rows", std::to_string(batch.rows().size())},
                               {"prompt_length", std::to_string(batch.prompt_length())},
                               {"response_length", std::to_string(batch.response_length())}}));
  v1::DumpBatchReply reply;
  reply.set_path(path);
  return reply;
}

}  // namespace rlhfd::roles

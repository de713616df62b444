#include "worker/roles/advantage_stage.h"

#include <ATen/ATen.h>

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/status/status_macros.h"
#include "worker/train/advantage.h"
#include "worker/train/losses.h"

namespace rlhfd::roles {
namespace {

// The whole batch's rows of `local` (this rank's), in row order: ranks hold equal, contiguous
// shares.
absl::StatusOr<at::Tensor> Gather(parallel::Communicator& pool, const at::Tensor& local) {
  if (pool.size() == 1) return local;
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] *= pool.size();
  at::Tensor all = at::empty(shape, local.options());
  RETURN_IF_ERROR(pool.AllGather(local.contiguous(), all));
  return all;
}

void AddStats(v1::AdvantageReply& reply, const std::string& name, const at::Tensor& values,
              const at::Tensor& mask) {
  const at::Tensor kept = values.masked_select(mask.to(at::kBool));
  auto& metrics = *reply.mutable_metrics();
  if (kept.numel() == 0) return;
  metrics[name + "/mean"] = kept.mean().item<double>();
  metrics[name + "/max"] = kept.max().item<double>();
  metrics[name + "/min"] = kept.min().item<double>();
}

}  // namespace

absl::StatusOr<v1::AdvantageReply> ComputeAdvantages(const v1::JobSpec& spec,
                                                     const v1::AdvantageRequest& request,
                                                     StepBatch& batch,
                                                     parallel::Communicator& pool) {
  const v1::AlgorithmSpec& algorithm = spec.algorithm();
  const int64_t local_rows = batch.rows().size();
  if (local_rows * pool.size() != batch.total_rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "advantages: the actor ranks must hold equal shares of the ", batch.total_rows(),
        " rows (this one holds ", local_rows, " of ", pool.size(), " ranks)"));
  }
  ASSIGN_OR_RETURN(const at::Tensor scores, batch.Get("scores", "advantages"));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("response_mask", "advantages"));
  // The score on each response's last sampled token, the policy's last action (none for a
  // response with none): in a multi-turn response, tool tokens (mask 0) sit between sampled
  // ones, so the count of sampled tokens is not the last one's index.
  at::Tensor token_scores = at::zeros_like(mask);
  const at::Tensor sampled = mask.gt(0);
  const at::Tensor nonempty = sampled.any(1);
  const at::Tensor last =
      (sampled.to(at::kLong) * at::arange(mask.size(1), mask.options().dtype(at::kLong))).amax(1);
  token_scores.scatter_(1, last.unsqueeze(1), (scores * nonempty.to(scores.dtype())).unsqueeze(1));

  at::Tensor token_rewards = token_scores;
  at::Tensor kl_per_row;
  const bool kl_in_reward = algorithms::KlPenalizesReward(algorithm);
  if (kl_in_reward) {
    ASSIGN_OR_RETURN(const at::Tensor old_log_probs, batch.Get("old_log_probs", "the KL reward"));
    ASSIGN_OR_RETURN(const at::Tensor ref_log_probs, batch.Get("ref_log_probs", "the KL reward"));
    const at::Tensor kl =
        train::KlEstimate(old_log_probs, ref_log_probs, algorithm.kl().estimator()) * mask;
    token_rewards = token_scores - request.kl_coef() * kl;
    kl_per_row = kl.sum(1) / mask.sum(1).clamp_min(1);  // verl's masked_mean over each row
  }
  RETURN_IF_ERROR(batch.Put("token_rewards", token_rewards));

  train::AdvantageInput input;
  ASSIGN_OR_RETURN(input.token_rewards, Gather(pool, token_rewards));
  ASSIGN_OR_RETURN(input.mask, Gather(pool, mask));
  at::Tensor all_values;
  const algorithms::EstimatorTraits* traits = algorithms::FindEstimator(algorithm.adv_estimator());
  const std::string needed_by =
      std::string(traits != nullptr ? traits->name : std::string_view("the")) + " advantages";
  if (traits != nullptr && traits->needs_critic) {
    ASSIGN_OR_RETURN(const at::Tensor values, batch.Get("values", needed_by));
    ASSIGN_OR_RETURN(all_values, Gather(pool, values));
    input.values = all_values;
  }
  if (traits != nullptr && traits->needs_greedy_baseline) {
    ASSIGN_OR_RETURN(const at::Tensor baselines, batch.Get("reward_baselines", needed_by));
    ASSIGN_OR_RETURN(input.baseline, Gather(pool, baselines));
  }
  const int64_t n = spec.roles().actor().rollout().n();
  input.group = at::arange(batch.total_rows(),
                           at::TensorOptions().dtype(at::kLong).device(mask.device()))
                    .div(n, "floor");
  input.gamma = algorithm.gamma();
  input.lam = algorithm.lam();
  input.norm_adv_by_std = algorithm.norm_adv_by_std_in_grpo();
  ASSIGN_OR_RETURN(const std::unique_ptr<train::AdvantageEstimator> estimator,
                   train::MakeAdvantageEstimator(algorithm.adv_estimator()));
  ASSIGN_OR_RETURN(const train::AdvantageOutput output, estimator->Compute(input));
  const int64_t first = batch.rows().begin;
  RETURN_IF_ERROR(batch.Put("advantages",
                            output.advantages.narrow(0, first, local_rows).to(at::kFloat).contiguous()));
  RETURN_IF_ERROR(batch.Put("returns",
                            output.returns.narrow(0, first, local_rows).to(at::kFloat).contiguous()));

  // Metrics over the whole batch, the same on every rank.
  v1::AdvantageReply reply;
  ASSIGN_OR_RETURN(const at::Tensor all_scores, Gather(pool, scores));
  const at::Tensor all_rows = at::ones_like(all_scores);
  AddStats(reply, "critic/score", all_scores, all_rows);
  AddStats(reply, "critic/rewards", input.token_rewards.sum(1), all_rows);
  AddStats(reply, "critic/advantages", output.advantages, input.mask);
  AddStats(reply, "critic/returns", output.returns, input.mask);
  if (all_values.defined()) AddStats(reply, "critic/values", all_values, input.mask);
  if (kl_in_reward) {
    ASSIGN_OR_RETURN(const at::Tensor all_kl, Gather(pool, kl_per_row));
    (*reply.mutable_metrics())["actor/reward_kl_penalty"] = all_kl.mean().item<double>();
    (*reply.mutable_metrics())["actor/reward_kl_penalty_coeff"] = request.kl_coef();
  }
  return reply;
}

}  // namespace rlhfd::roles

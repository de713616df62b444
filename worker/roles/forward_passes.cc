#include "worker/roles/forward_passes.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/train/batching.h"
#include "worker/train/chunked_log_probs.h"

namespace rlhfd::roles {
namespace {

// Runs `per_micro_batch(ids, mask)` over the forwards PlanForwards makes and puts the results
// back in row order; what LibTorch throws (out of memory, say) comes back as a status naming
// `what` and the setting to lower.
template <typename Function>
absl::StatusOr<at::Tensor> InMicroBatches(const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask,
                                          const ForwardMicroBatches& micro, const char* what,
                                          Function per_micro_batch) {
  try {
    at::NoGradGuard no_grad;
    ASSIGN_OR_RETURN(ForwardPlan plan, PlanForwards(attention_mask, micro));
    // No rows: a stand-in forward, dropped, gives the (empty) result its shape.
    if (plan.forwards.empty()) plan.forwards.push_back({kStandInRow});
    const std::vector<std::vector<int64_t>>& forwards = plan.forwards;
    const size_t real = plan.real;
    at::Tensor dropped;  // A dropped forward's result: the shape of one with no rows.
    std::vector<at::Tensor> parts;
    std::vector<int64_t> order;  // The row of each result, in the order computed.
    for (size_t k = 0; k < forwards.size(); ++k) {
      const std::vector<int64_t>& rows = forwards[k];
      const bool consecutive = rows.back() - rows.front() + 1 == static_cast<int64_t>(rows.size());
      at::Tensor ids, mask;
      if (rows.front() == kStandInRow) {
        // A replica without rows keeps in step with a row of token 0 over the whole width.
        ids = at::zeros({1, input_ids.size(1)}, input_ids.options());
        mask = at::ones({1, attention_mask.size(1)}, attention_mask.options());
      } else if (consecutive) {
        ids = input_ids.narrow(0, rows.front(), static_cast<int64_t>(rows.size()));
        mask = attention_mask.narrow(0, rows.front(), static_cast<int64_t>(rows.size()));
      } else {
        const at::Tensor index = at::tensor(rows, at::kLong).to(input_ids.device());
        ids = input_ids.index_select(0, index);
        mask = attention_mask.index_select(0, index);
      }
      at::Tensor result = per_micro_batch(ids, mask);
      if (k >= real) {  // A forward only to keep the replicas' collectives in step.
        dropped = std::move(result);
        continue;
      }
      parts.push_back(std::move(result));
      order.insert(order.end(), rows.begin(), rows.end());
    }
    if (parts.empty()) return dropped.narrow(0, 0, 0);
    at::Tensor computed = at::cat(parts);
    if (std::is_sorted(order.begin(), order.end())) return computed;
    at::Tensor in_order = at::empty_like(computed);
    in_order.index_copy_(0, at::tensor(order, at::kLong).to(computed.device()), computed);
    return in_order;
  } catch (const c10::OutOfMemoryError& error) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " ran out of device memory; lower ", micro.setting, " (",
                     micro.token_budget > 0 ? micro.token_budget : micro.rows, ")"));
  } catch (const std::exception& error) {
    return absl::InternalError(
        absl::StrCat(what, " failed: ", std::string(error.what()).substr(0, 300)));
  }
}

}  // namespace

absl::StatusOr<ForwardPlan> PlanForwards(const at::Tensor& attention_mask,
                                         const ForwardMicroBatches& micro) {
  if (micro.rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(micro.setting, ": ", micro.rows, " rows per forward; need at least 1"));
  }
  const int64_t rows = attention_mask.size(0), width = attention_mask.size(1);
  std::vector<int64_t> all(rows), real, tokens;
  std::iota(all.begin(), all.end(), 0);
  const bool lockstep = micro.lockstep != nullptr && micro.lockstep->lockstep_forwards();
  if (micro.token_budget > 0 || lockstep) {  // (Otherwise the mask's counts are not needed.)
    const at::Tensor counts = attention_mask.sum(1).to(at::kCPU, at::kLong).contiguous();
    real.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + rows);
    // What a forward computes: the real tokens where it packs them, every column where it pads.
    tokens = micro.padded ? std::vector<int64_t>(rows, width) : real;
  }
  ForwardPlan plan;
  plan.forwards =
      train::SplitMicroBatches(all, tokens, micro.rows, micro.token_budget, micro.group);
  plan.real = plan.forwards.size();
  // Forwards packed by tokens may come out unequal in number across the replicas, and so may
  // fixed micro-batches over unequal shares (a validation's, which can leave a replica none).
  if (lockstep) {
    std::vector<double> most = {static_cast<double>(plan.forwards.size())};
    RETURN_IF_ERROR(micro.lockstep->ReduceOverReplicas(most, train::ReplicaReduce::kMax));
    // The longest row: a packed forward of rows with fewer than two tokens runs no model, and
    // so none of the collectives the replicas wait for. Without rows, kStandInRow.
    const int64_t longest =
        rows == 0 ? kStandInRow : std::max_element(real.begin(), real.end()) - real.begin();
    while (plan.forwards.size() < static_cast<size_t>(most[0])) plan.forwards.push_back({longest});
  }
  return plan;
}

int64_t RowsPerPrompt(const v1::JobSpec& spec) {
  return spec.trainer().mode() == v1::TRAINER_MODE_SFT
             ? 1
             : std::max<int64_t>(1, spec.roles().actor().rollout().n());
}

namespace {

// Fixed rows, or with `by_tokens` a budget of `tokens`; `rows_key` / `tokens_key` name them.
ForwardMicroBatches Choose(const v1::JobSpec& spec, int64_t rows, const std::string& rows_key,
                           bool by_tokens, int64_t tokens, const std::string& tokens_key,
                           bool padded, train::TrainedModel* trained) {
  return {.rows = rows,
          .token_budget = by_tokens ? tokens : 0,
          .group = RowsPerPrompt(spec),
          .padded = padded,
          .setting = by_tokens ? tokens_key : rows_key,
          .lockstep = trained};
}

}  // namespace

ForwardMicroBatches ActorLogProbForwards(const v1::JobSpec& spec, bool padded,
                                         train::TrainedModel* trained) {
  if (spec.trainer().mode() == v1::TRAINER_MODE_SFT) {
    // Its only log-prob forwards are its validation's, over rows like the update's (verl's SFT
    // trainer validates with its training micro-batches).
    const v1::TrainSpec& train = spec.roles().actor().train();
    return Choose(spec, train.ppo_micro_batch_size_per_gpu(),
                  "roles.actor.train.ppo_micro_batch_size_per_gpu", train.use_dynamic_bsz(),
                  train.ppo_max_token_len_per_gpu(), "roles.actor.train.ppo_max_token_len_per_gpu",
                  padded, trained);
  }
  const v1::RolloutSpec& rollout = spec.roles().actor().rollout();
  return Choose(spec, rollout.log_prob_micro_batch_size_per_gpu(),
                "roles.actor.rollout.log_prob_micro_batch_size_per_gpu",
                rollout.log_prob_use_dynamic_bsz(), rollout.log_prob_max_token_len_per_gpu(),
                "roles.actor.rollout.log_prob_max_token_len_per_gpu", padded, trained);
}

ForwardMicroBatches ReferenceLogProbForwards(const v1::JobSpec& spec, bool padded) {
  const v1::ReferenceSpec& reference = spec.roles().reference();
  return Choose(spec, reference.log_prob_micro_batch_size_per_gpu(),
                "roles.reference.log_prob_micro_batch_size_per_gpu",
                reference.log_prob_use_dynamic_bsz(), reference.log_prob_max_token_len_per_gpu(),
                "roles.reference.log_prob_max_token_len_per_gpu", padded, nullptr);
}

ForwardMicroBatches CriticValueForwards(const v1::JobSpec& spec, bool padded,
                                        train::TrainedModel* trained) {
  const v1::CriticSpec& critic = spec.roles().critic();
  return Choose(spec, critic.train().ppo_micro_batch_size_per_gpu(),
                "roles.critic.train.ppo_micro_batch_size_per_gpu", critic.train().use_dynamic_bsz(),
                critic.forward_max_token_len_per_gpu(),
                "roles.critic.forward_max_token_len_per_gpu", padded, trained);
}

at::Tensor ToTrainingLayout(const at::Tensor& per_token, int64_t prompt_length) {
  return at::constant_pad_nd(per_token, {prompt_length - 1, 0});
}

namespace {

// The positions (n, T - 1) that predict a response token: only those are scored.
at::Tensor ResponsePositions(const at::Tensor& mask, int64_t prompt_length) {
  const int64_t response_length = mask.size(1) - prompt_length;
  return ToTrainingLayout(mask.narrow(1, prompt_length, response_length), prompt_length);
}

}  // namespace

absl::StatusOr<at::Tensor> ResponseLogProbs(model::Transformer& model, const at::Tensor& input_ids,
                                            const at::Tensor& attention_mask, int64_t prompt_length,
                                            const ForwardMicroBatches& micro, double temperature) {
  const int64_t response_length = input_ids.size(1) - prompt_length;
  return InMicroBatches(
      input_ids, attention_mask, micro, "log-probs",
      [&](const at::Tensor& ids, const at::Tensor& mask) {
        const train::ScoredPositions scored = train::ForwardMicroBatch(
            model, ids, mask, {.scored = ResponsePositions(mask, prompt_length)});
        const at::Tensor log_probs = scored.Unflatten(
            train::ChunkedLogProbs(train::TemperatureScaled(scored.hidden, temperature),
                                   model->HeadWeight(), scored.targets)
                .first);
        return log_probs.narrow(1, prompt_length - 1, response_length).to(at::kFloat) *
               mask.narrow(1, prompt_length, response_length);
      });
}

absl::StatusOr<at::Tensor> ResponseValues(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask, int64_t prompt_length,
                                          const ForwardMicroBatches& micro) {
  const int64_t response_length = input_ids.size(1) - prompt_length;
  return InMicroBatches(
      input_ids, attention_mask, micro, "values",
      [&](const at::Tensor& ids, const at::Tensor& mask) {
        const train::ScoredPositions scored = train::ForwardMicroBatch(
            model, ids, mask, {.scored = ResponsePositions(mask, prompt_length)});
        const at::Tensor values = scored.Unflatten(model->Scores(scored.hidden).squeeze(-1));
        return values.narrow(1, prompt_length - 1, response_length).to(at::kFloat) *
               mask.narrow(1, prompt_length, response_length);
      });
}

absl::StatusOr<at::Tensor> SequenceScores(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask,
                                          const ForwardMicroBatches& micro) {
  return InMicroBatches(
      input_ids, attention_mask, micro, "reward scores",
      [&](const at::Tensor& ids, const at::Tensor& mask) {
        const at::Tensor hidden = model->Hidden({.input_ids = ids, .attention_mask = mask});
        // The last real token: the largest position whose mask is 1.
        const at::Tensor positions = at::arange(mask.size(1), mask.options()).unsqueeze(0);
        const at::Tensor last = (positions * mask).argmax(1);
        const at::Tensor picked =
            hidden.index({at::arange(ids.size(0), last.options()), last});  // (rows, C)
        return model->Scores(picked).select(-1, 0).to(at::kFloat);
      });
}

}  // namespace rlhfd::roles

// The no-gradient forwards the stages run over a step's rows, in micro-batches, and the layout
// conversions between the step's tensors (response-aligned, rows × R) and the updates' (rows ×
// (P + R − 1), position p predicting token p + 1).
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "worker/model/transformer.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

// How a pass cuts a step's rows into forwards: `rows` each, or (token_budget > 0) rows packed
// first-fit by decreasing length up to that many tokens (a longer row goes alone), as verl's
// log_prob_use_dynamic_bsz with log_prob_max_token_len_per_gpu. A row counts its real tokens
// where the forward packs rows (on a GPU in bf16), its padded width where the forward pads them.
// Results come back in row order.
struct ForwardMicroBatches {
  int64_t rows = 16;
  int64_t token_budget = 0;
  // Consecutive rows that share a prompt (rollout.n): forwards by tokens keep them together where
  // they fit, so the prompt is computed once (train::SplitMicroBatches).
  int64_t group = 1;
  bool padded = false;  // The forward pads its rows: each costs the batch's padded width.
  std::string setting;  // The key to lower when a forward runs out of device memory.
  // A layout that gathers parameters inside its forwards (ZeRO-3) needs every replica to run as
  // many forwards as the most any needs: this rank then pads with forwards it drops.
  train::TrainedModel* lockstep = nullptr;
};

// The forwards of a pass over `attention_mask`'s rows, and how many of them count: past those,
// forwards of the longest row (kStandInRow where there are no rows: a row of token 0) only keep
// this replica's collectives in step with the others' (ForwardMicroBatches::lockstep).
inline constexpr int64_t kStandInRow = -1;
struct ForwardPlan {
  std::vector<std::vector<int64_t>> forwards;
  size_t real = 0;
};
absl::StatusOr<ForwardPlan> PlanForwards(const at::Tensor& attention_mask,
                                         const ForwardMicroBatches& micro);

// How many consecutive rows of a step share a prompt: rollout.n (a step's rows are prompt-major),
// 1 in trainer.mode sft (each row an example of its own).
int64_t RowsPerPrompt(const v1::JobSpec& spec);

// The passes' micro-batches from the job's settings; `padded`: the forwards pad their rows
// (`!model->PacksWithVarlenAttention(device)` for log-probs and values; a reward model's score
// forward always pads).
// The actor's old log-probs (and a reward model's scores):
// roles.actor.rollout.log_prob_{micro_batch_size_per_gpu, use_dynamic_bsz, max_token_len_per_gpu};
// in trainer.mode sft (its validation's loss) the update's train.ppo_micro_batch_size_per_gpu,
// use_dynamic_bsz and ppo_max_token_len_per_gpu.
ForwardMicroBatches ActorLogProbForwards(const v1::JobSpec& spec, bool padded,
                                         train::TrainedModel* trained);
// roles.reference.log_prob_*, as the actor's.
ForwardMicroBatches ReferenceLogProbForwards(const v1::JobSpec& spec, bool padded);
// The critic's value forwards: its train.ppo_micro_batch_size_per_gpu, or with
// train.use_dynamic_bsz roles.critic.forward_max_token_len_per_gpu tokens.
ForwardMicroBatches CriticValueForwards(const v1::JobSpec& spec, bool padded,
                                        train::TrainedModel* trained);

// (rows, R) → (rows, P + R − 1): zeros over the prompt's positions.
at::Tensor ToTrainingLayout(const at::Tensor& per_token, int64_t prompt_length);

// Log-probabilities (rows, R) of the response tokens under softmax(logits / temperature); zero
// past each response. Causal-LM head.
absl::StatusOr<at::Tensor> ResponseLogProbs(model::Transformer& model, const at::Tensor& input_ids,
                                            const at::Tensor& attention_mask, int64_t prompt_length,
                                            const ForwardMicroBatches& micro, double temperature);

// Values (rows, R): the score head at the position before each response token (the position
// whose value estimates the return from that token on), as the critic update reads them.
absl::StatusOr<at::Tensor> ResponseValues(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask, int64_t prompt_length,
                                          const ForwardMicroBatches& micro);

// A reward model's score (rows): its head at each row's last real token (verl's reward model).
absl::StatusOr<at::Tensor> SequenceScores(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask,
                                          const ForwardMicroBatches& micro);

}  // namespace rlhfd::roles

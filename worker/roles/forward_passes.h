// The no-gradient forwards the stages run over a step's rows, in micro-batches, and the layout
// conversions between the step's tensors (response-aligned, rows × R) and the updates' (rows ×
// (P + R − 1), position p predicting token p + 1).
#pragma once

#include <ATen/Tensor.h>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"

namespace rlhfd::roles {

// (rows, R) → (rows, P + R − 1): zeros over the prompt's positions.
at::Tensor ToTrainingLayout(const at::Tensor& per_token, int64_t prompt_length);

// Log-probabilities (rows, R) of the response tokens under softmax(logits / temperature); zero
// past each response. Causal-LM head.
absl::StatusOr<at::Tensor> ResponseLogProbs(model::Transformer& model, const at::Tensor& input_ids,
                                            const at::Tensor& attention_mask, int64_t prompt_length,
                                            int64_t micro_batch, double temperature);

// Values (rows, R): the score head at the position before each response token (the position
// whose value estimates the return from that token on), as the critic update reads them.
absl::StatusOr<at::Tensor> ResponseValues(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask, int64_t prompt_length,
                                          int64_t micro_batch);

// A reward model's score (rows): its head at each row's last real token (verl's reward model).
absl::StatusOr<at::Tensor> SequenceScores(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask, int64_t micro_batch);

}  // namespace rlhfd::roles

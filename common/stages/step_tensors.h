// The step's named tensors, in one table: each tensor's name (the key stage calls and moves use),
// the shape of its rows, and the stage that makes it. The worker's StepBatch checks what a stage
// puts and gets against it; the driver names the tensors it moves from it. Adding a tensor is one
// row here (and the stage that makes it).
#pragma once

#include <string_view>

namespace rlhfd::stages {

// The shape of a named tensor's rows.
enum class TensorKind {
  kTokens,    // (rows, P + R), int64: input_ids, attention_mask
  kPerToken,  // (rows, R), float32: response_mask, log-probs, values, rewards, advantages
  kPerRow,    // (rows), float32: scores
};

struct StepTensor {
  std::string_view name;
  TensorKind kind;
  std::string_view made_by;  // for errors about stages called out of order
};

namespace tensors {
inline constexpr std::string_view kInputIds = "input_ids";
inline constexpr std::string_view kAttentionMask = "attention_mask";
inline constexpr std::string_view kResponseMask = "response_mask";
inline constexpr std::string_view kRolloutLogProbs = "rollout_log_probs";
// trainer.mode async: the step whose update the weights that sampled each token include.
inline constexpr std::string_view kRolloutWeightsStep = "rollout_weights_step";
inline constexpr std::string_view kOldLogProbs = "old_log_probs";
inline constexpr std::string_view kRefLogProbs = "ref_log_probs";
inline constexpr std::string_view kValues = "values";
inline constexpr std::string_view kScores = "scores";
inline constexpr std::string_view kTokenRewards = "token_rewards";
inline constexpr std::string_view kAdvantages = "advantages";
inline constexpr std::string_view kReturns = "returns";
inline constexpr std::string_view kRewardBaselines = "reward_baselines";
}  // namespace tensors

inline constexpr StepTensor kStepTensors[] = {
    {tensors::kInputIds, TensorKind::kTokens, "generate"},
    {tensors::kAttentionMask, TensorKind::kTokens, "generate"},
    {tensors::kResponseMask, TensorKind::kPerToken, "generate"},
    {tensors::kRolloutLogProbs, TensorKind::kPerToken, "generate"},
    {tensors::kRolloutWeightsStep, TensorKind::kPerToken, "generate (trainer.mode async)"},
    {tensors::kOldLogProbs, TensorKind::kPerToken, "a forward of kind OLD_LOG_PROBS on the actor"},
    {tensors::kRefLogProbs, TensorKind::kPerToken,
     "a forward of kind REF_LOG_PROBS on the reference"},
    {tensors::kValues, TensorKind::kPerToken, "a forward of kind VALUES on the critic"},
    {tensors::kScores, TensorKind::kPerRow,
     "rewards (or a REWARD_SCORES forward on the reward model)"},
    {tensors::kTokenRewards, TensorKind::kPerToken, "advantages"},
    {tensors::kAdvantages, TensorKind::kPerToken, "advantages"},
    {tensors::kReturns, TensorKind::kPerToken, "advantages"},
    {tensors::kRewardBaselines, TensorKind::kPerRow, "generate (remax's greedy baseline)"},
};

// The row of `name`; nullptr when no row has it.
constexpr const StepTensor* FindStepTensor(std::string_view name) {
  for (const StepTensor& tensor : kStepTensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

}  // namespace rlhfd::stages

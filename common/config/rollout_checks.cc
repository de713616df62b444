#include "common/config/rollout_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/algorithms/algorithm_traits.h"

namespace rlhfd::config {

void CheckRollout(Checker& check, const v1::JobSpec& spec) {
  const v1::RolesSpec& roles = spec.roles();
  const v1::DataSpec& data = spec.data();
  const int actor_gpus = roles.actor().gpus() <= kMaxGpus ? roles.actor().gpus() : 0;
  const v1::RolloutSpec& rollout = roles.actor().rollout();
  check.Within("roles.actor.rollout.n", rollout.n(), 1, kMaxSamplesPerPrompt);
  check.AtLeast("roles.actor.rollout.temperature", rollout.temperature(), 0);
  check.Within("roles.actor.rollout.top_p", rollout.top_p(), 1e-9, 1);
  check.Within("roles.actor.rollout.top_k", rollout.top_k(), -1, kMaxVocabulary);
  check.Within("roles.actor.rollout.max_num_seqs", rollout.max_num_seqs(), 1, kMaxBatch);
  check.Within("roles.actor.rollout.update_weights_bucket_megabytes",
               rollout.update_weights_bucket_megabytes(), 1, 65536);
  for (int i = 0; i < rollout.stop_token_ids_size(); ++i) {
    check.Within(absl::StrCat("roles.actor.rollout.stop_token_ids[", i, "]"),
                 rollout.stop_token_ids(i), 0, kMaxVocabulary);
  }
  check.OpenInterval("roles.actor.rollout.gpu_memory_utilization", rollout.gpu_memory_utilization(),
                     0, 1);
  check.Within("roles.actor.rollout.max_new_tokens", rollout.max_new_tokens(), 0,
               data.max_response_length());
  if (rollout.tp() < 1 || rollout.tp() > kMaxGpus ||
      (actor_gpus >= 1 && actor_gpus % rollout.tp() != 0)) {
    check.Fail("roles.actor.rollout.tp",
               absl::StrCat(rollout.tp(), " must divide roles.actor.gpus (", actor_gpus, ")"));
  }
  check.Within("roles.actor.rollout.log_prob_micro_batch_size_per_gpu",
               rollout.log_prob_micro_batch_size_per_gpu(), 1, kMaxBatch);
  check.Within("roles.actor.rollout.log_prob_max_token_len_per_gpu",
               rollout.log_prob_max_token_len_per_gpu(), 1, kMaxTokens);
  if (const v1::MultiTurnSpec& turns = rollout.multi_turn(); turns.enable()) {
    const std::string at = "roles.actor.rollout.multi_turn.";
    if (turns.tool_config_path().empty()) {
      check.Fail(at + "tool_config_path",
                 "is required with multi_turn.enable: the tool config (verl's YAML) listing the "
                 "tools the model may call");
    }
    if (turns.format() != "hermes") {
      check.Fail(at + "format", absl::StrCat("'", turns.format(),
                                             "' is not hermes, the one tool-call format read"));
    }
    check.Within(at + "max_assistant_turns", turns.max_assistant_turns(), 0, 1000);
    check.Within(at + "max_user_turns", turns.max_user_turns(), 0, 1000);
    check.Within(at + "max_parallel_calls", turns.max_parallel_calls(), 1, 64);
    check.Within(at + "max_tool_response_length", turns.max_tool_response_length(), 1, 1 << 20);
    const std::string& side = turns.tool_response_truncate_side();
    if (side != "left" && side != "right" && side != "middle") {
      check.Fail(at + "tool_response_truncate_side",
                 absl::StrCat("'", side, "' is not one of: left, right, middle"));
    }
    if (rollout.tp() > 1) {
      check.Fail(at + "enable", absl::StrCat("multi-turn rollouts run at roles.actor.rollout.tp "
                                             "1 for now; it is ",
                                             rollout.tp()));
    }
  }
  const bool async = spec.trainer().mode() == v1::TRAINER_MODE_ASYNC;
  if (async) {
    check.Within("trainer.max_staleness", spec.trainer().max_staleness(), 1, 4);
    if (!roles.has_rollout()) {
      check.Fail("trainer.mode",
                 "async needs a rollout pool of its own that keeps generating while the actor "
                 "trains: add roles.rollout (gpus: N)");
    }
  }
  if (roles.has_rollout() && roles.rollout().partial_rollout()) {
    if (!async) {
      check.Fail("roles.rollout.partial_rollout",
                 "interrupts generation for a weight update, which only trainer.mode async sends "
                 "mid-rollout; set trainer.mode: async or remove it");
    }
    if (rollout.tp() > 1) {
      check.Fail("roles.rollout.partial_rollout",
                 absl::StrCat("runs at roles.actor.rollout.tp 1 for now; it is ", rollout.tp()));
    }
  }
  if (roles.has_rollout()) {
    // A rollout pool of its own: what it does not run yet is refused, naming what to change.
    const int pool = roles.rollout().gpus();
    check.Within("roles.rollout.gpus", pool, 1, kMaxGpus);
    if (pool >= 1 && rollout.tp() >= 1 && pool % rollout.tp() != 0) {
      check.Fail("roles.rollout.gpus",
                 absl::StrCat(pool, " is not a multiple of roles.actor.rollout.tp (", rollout.tp(),
                              "): the pool generates in tensor-parallel groups of that size"));
    }
    if (pool >= 1 && data.train_batch_size() % pool != 0) {
      check.Fail(
          "roles.rollout.gpus",
          absl::StrCat(pool, " does not divide data.train_batch_size (", data.train_batch_size(),
                       "): each rollout rank generates an equal share of the prompts"));
    }
    if (rollout.multi_turn().enable()) {
      check.Fail("roles.rollout",
                 "multi-turn rollouts run on the actor's ranks for now; remove "
                 "roles.rollout or roles.actor.rollout.multi_turn.enable");
    }
    if (algorithms::NeedsGreedyBaseline(spec.algorithm())) {
      check.Fail("roles.rollout",
                 "remax's greedy baseline is generated on the actor's ranks; "
                 "remove roles.rollout");
    }
    if (spec.model().lora_rank() > 0 || !spec.model().lora_adapter_path().empty()) {
      check.Fail("roles.rollout",
                 "a LoRA actor's rollout runs on the actor's ranks for now; "
                 "remove roles.rollout");
    }
  }
}

}  // namespace rlhfd::config

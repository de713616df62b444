// JobSpec defaults (keep in step with the "Default:" comments in proto/rlhfd/v1/job_spec.proto;
// job_config_test checks that each scalar here is a field of the schema).
#include "common/config/job_defaults.h"

#include <map>
#include <set>
#include <string>

namespace rlhfd::config {
namespace {

constexpr const char* kDefaultsJson = R"json({
  "model": {"dtype": "DTYPE_BF16", "tokenizer_path": "", "chat_template": "auto", "lora_rank": 0,
            "lora_alpha": 16, "target_modules": ["all-linear"], "lora_adapter_path": ""},
  "data": {
    "prompt_key": "prompt", "answer_key": "ground_truth",
    "max_prompt_length": 512, "max_response_length": 512,
    "train_batch_size": 1024, "shuffle": true, "shuffle_seed": 1,
    "filter_overlong_prompts": false, "truncation": "TRUNCATION_ERROR", "messages_key": "messages",
    "tools_key": "tools", "response_key": "", "enable_thinking_key": "enable_thinking"
  },
  "algorithm": {
    "adv_estimator": "ADVANTAGE_ESTIMATOR_GAE", "gamma": 1.0, "lam": 1.0,
    "kl": {"mode": "KL_MODE_NONE", "coef": 0.001,
           "controller": "KL_CONTROLLER_FIXED", "target": 0.1, "horizon": 10000},
    "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "entropy_coeff": 0.0,
    "loss_agg_mode": "LOSS_AGGREGATION_TOKEN_MEAN", "norm_adv_by_std_in_grpo": true,
    "policy_loss": "POLICY_LOSS_VANILLA", "tau_pos": 1.0, "tau_neg": 1.05,
    "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002,
    "ppo_kl_coef": 0.1, "dro_beta": 0.0,
    "rollout_correction": {"rollout_is": "", "rollout_is_threshold": 2.0,
                           "rollout_is_batch_normalize": false, "bypass_mode": false}
  },
  "roles": {
    "actor": {
      "gpus": 1,
      "train": {
        "tp": 1, "ppo_mini_batch_size": 256, "ppo_micro_batch_size_per_gpu": 8,
        "use_dynamic_bsz": false, "ppo_max_token_len_per_gpu": 16384, "lr": 1e-6,
        "lr_schedule": "LR_SCHEDULE_CONSTANT", "lr_warmup_steps": 0, "min_lr_ratio": 0.0,
        "weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.999, "grad_clip": 1.0,
        "ppo_epochs": 1, "gradient_checkpointing": false, "cliprange_value": 0.5,
        "zero_stage": 3, "param_offload": false, "optimizer_offload": false
      },
      "rollout": {
        "tp": 1, "n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 0,
        "max_num_seqs": 1024, "gpu_memory_utilization": 0.5,
        "update_weights_bucket_megabytes": 1024,
        "log_prob_micro_batch_size_per_gpu": 16, "log_prob_use_dynamic_bsz": false,
        "log_prob_max_token_len_per_gpu": 16384, "enable_prefix_caching": true,
        "val_kwargs": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "n": 1, "do_sample": false},
        "multi_turn": {
          "enable": false, "tool_config_path": "", "format": "hermes", "max_assistant_turns": 0,
          "max_user_turns": 0, "max_parallel_calls": 1, "max_tool_response_length": 256,
          "tool_response_truncate_side": "middle"
        }
      }
    },
    "critic": {
      "model_path": "", "forward_max_token_len_per_gpu": 32768,
      "train": {
        "tp": 1, "ppo_mini_batch_size": 256, "ppo_micro_batch_size_per_gpu": 8,
        "use_dynamic_bsz": false, "ppo_max_token_len_per_gpu": 32768, "lr": 1e-5,
        "lr_schedule": "LR_SCHEDULE_CONSTANT", "lr_warmup_steps": 0, "min_lr_ratio": 0.0,
        "weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.999, "grad_clip": 1.0,
        "ppo_epochs": 1, "gradient_checkpointing": false, "cliprange_value": 0.5,
        "zero_stage": 3, "param_offload": false, "optimizer_offload": false
      }
    },
    "reference": {"log_prob_micro_batch_size_per_gpu": 16, "param_offload": false,
                  "log_prob_use_dynamic_bsz": false, "log_prob_max_token_len_per_gpu": 16384},
    "rollout": {"gpus": 1, "partial_rollout": false},
    "reward": {"rule": "", "model": "", "remote": "", "remote_timeout_s": 30.0}
  },
  "placement": "PLACEMENT_SPLIT",
  "trainer": {
    "total_steps": 0, "total_epochs": 30, "save_every": 0, "val_every": 0,
    "checkpoint_dir": "", "resume": true, "loggers": ["console"], "seed": 1,
    "project_name": "rlhfd", "experiment_name": "", "critic_warmup": 0,
    "val_before_train": true, "val_only": false, "max_restarts": 3, "device": "auto", "rollout_data_dir": "", "priority": 0,
    "max_ckpt_to_keep": 0, "max_nonfinite_skips": 0, "log_samples": 4,
    "mode": "TRAINER_MODE_SYNC", "max_staleness": 1, "verify_weight_sync": 0, "async_save": false,
    "checkpoint_uri": "", "profile_steps": [], "profile_dir": ""
  }
})json";

// Where a default differs from verl's for a key verl users know, or verl has none: said next to
// the value by `rlhfctl validate` and in docs/config-reference.md.
const std::map<std::string, std::string>& VerlNotes() {
  static const std::map<std::string, std::string> notes = {
      {"roles.actor.train.ppo_micro_batch_size_per_gpu", "verl has no default: it must be set"},
      {"roles.critic.train.ppo_micro_batch_size_per_gpu", "verl has no default: it must be set"},
      {"roles.actor.rollout.log_prob_micro_batch_size_per_gpu",
       "verl has no default: it must be set"},
      {"roles.reference.log_prob_micro_batch_size_per_gpu", "verl has no default: it must be set"},
      {"roles.actor.rollout.tp", "verl's tensor_model_parallel_size defaults to 2"},
      {"roles.actor.rollout.update_weights_bucket_megabytes",
       "verl's checkpoint_engine.update_weights_bucket_megabytes defaults to 2048"},
      {"roles.actor.train.gradient_checkpointing",
       "verl's model.enable_gradient_checkpointing defaults to true"},
      {"roles.critic.train.gradient_checkpointing",
       "verl's model.enable_gradient_checkpointing defaults to true"},
      {"trainer.loggers", "verl's default is [console, wandb]; wandb is not supported"},
      {"trainer.project_name", "verl's default is verl_examples"},
      {"trainer.experiment_name", "the job's name; verl's default is gsm8k"},
      {"trainer.save_every", "0: at the end only; verl's save_freq -1 (never) is -1 here"},
      {"trainer.val_every", "0: never, like verl's test_freq -1"},
      {"trainer.log_samples",
       "verl's log_val_generations (validation only) defaults to 0; here training steps too"},
      {"placement", "verl's hybrid engine colocates actor, rollout and reference"},
  };
  return notes;
}

const std::set<std::string>& OptionalSections() {
  static const std::set<std::string> sections = {"roles.critic", "roles.reference",
                                                 "roles.rollout"};
  return sections;
}

void Merge(const nlohmann::json& defaults, const std::string& path, nlohmann::json* config,
           std::set<std::string>* filled) {
  for (const auto& [key, value] : defaults.items()) {
    const std::string key_path = path.empty() ? key : path + "." + key;
    const bool present = config->contains(key);
    if (!present && OptionalSections().count(key_path)) continue;
    if (value.is_object()) {
      if (!present) (*config)[key] = nlohmann::json::object();
      // A non-mapping here was already reported by the schema walker.
      if ((*config)[key].is_object()) Merge(value, key_path, &(*config)[key], filled);
    } else if (!present) {
      (*config)[key] = value;
      if (filled != nullptr) filled->insert(key_path);
    }
  }
}

}  // namespace

const std::map<std::string, std::string>& VerlDefaultNotes() { return VerlNotes(); }

const nlohmann::json& JobSpecDefaults() {
  static const nlohmann::json defaults = nlohmann::json::parse(kDefaultsJson);
  return defaults;
}

void MergeJobSpecDefaults(nlohmann::json* config, std::set<std::string>* filled) {
  Merge(JobSpecDefaults(), "", config, filled);
}

}  // namespace rlhfd::config

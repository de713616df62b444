// JobSpec defaults (keep in step with the "Default:" comments in proto/rlhfd/v1/job_spec.proto;
// job_config_test checks that each scalar here is a field of the schema).
#include "common/config/job_defaults.h"

#include <set>
#include <string>

namespace rlhfd::config {
namespace {

constexpr const char* kDefaultsJson = R"json({
  "model": {"dtype": "DTYPE_BF16", "tokenizer_path": "", "chat_template": "auto"},
  "data": {
    "prompt_key": "prompt", "answer_key": "ground_truth",
    "max_prompt_length": 512, "max_response_length": 1024,
    "train_batch_size": 256, "shuffle": true, "shuffle_seed": 1
  },
  "algorithm": {
    "adv_estimator": "ADVANTAGE_ESTIMATOR_GRPO", "gamma": 1.0, "lam": 1.0,
    "kl": {"mode": "KL_MODE_LOSS", "coef": 0.001, "estimator": "KL_ESTIMATOR_K3",
           "controller": "KL_CONTROLLER_FIXED", "target": 0.1, "horizon": 10000},
    "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "entropy_coeff": 0.0,
    "loss_agg_mode": "LOSS_AGGREGATION_TOKEN_MEAN", "norm_adv_by_std_in_grpo": true
  },
  "roles": {
    "actor": {
      "gpus": 1,
      "train": {
        "tp": 1, "ppo_mini_batch_size": 64, "ppo_micro_batch_size_per_gpu": 8,
        "ppo_max_token_len_per_gpu": 0, "lr": 1e-6, "lr_schedule": "LR_SCHEDULE_CONSTANT",
        "lr_warmup_steps": 0, "min_lr_ratio": 0.0, "weight_decay": 0.01,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "grad_clip": 1.0, "ppo_epochs": 1,
        "gradient_checkpointing": false, "cliprange_value": 0.5
      },
      "rollout": {
        "tp": 1, "n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 0,
        "max_num_seqs": 256, "gpu_memory_utilization": 0.6
      }
    },
    "critic": {
      "model_path": "",
      "train": {
        "tp": 1, "ppo_mini_batch_size": 64, "ppo_micro_batch_size_per_gpu": 8,
        "ppo_max_token_len_per_gpu": 0, "lr": 1e-5, "lr_schedule": "LR_SCHEDULE_CONSTANT",
        "lr_warmup_steps": 0, "min_lr_ratio": 0.0, "weight_decay": 0.01,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "grad_clip": 1.0, "ppo_epochs": 1,
        "gradient_checkpointing": false, "cliprange_value": 0.5
      }
    },
    "reference": {"micro_batch_size_per_gpu": 16},
    "reward": {"rule": "", "model": "", "remote": "", "remote_timeout_s": 30.0}
  },
  "placement": "PLACEMENT_SPLIT",
  "trainer": {
    "total_steps": 0, "total_epochs": 1, "save_every": 0, "val_every": 0,
    "checkpoint_dir": "", "resume": true, "loggers": ["console"], "seed": 1
  }
})json";

const std::set<std::string>& OptionalSections() {
  static const std::set<std::string> sections = {"roles.critic", "roles.reference"};
  return sections;
}

void Merge(const nlohmann::json& defaults, const std::string& path, nlohmann::json* config) {
  for (const auto& [key, value] : defaults.items()) {
    const std::string key_path = path.empty() ? key : path + "." + key;
    const bool present = config->contains(key);
    if (!present && OptionalSections().count(key_path)) continue;
    if (value.is_object()) {
      if (!present) (*config)[key] = nlohmann::json::object();
      // A non-mapping here was already reported by the schema walker.
      if ((*config)[key].is_object()) Merge(value, key_path, &(*config)[key]);
    } else if (!present) {
      (*config)[key] = value;
    }
  }
}

}  // namespace

const nlohmann::json& JobSpecDefaults() {
  static const nlohmann::json defaults = nlohmann::json::parse(kDefaultsJson);
  return defaults;
}

void MergeJobSpecDefaults(nlohmann::json* config) { Merge(JobSpecDefaults(), "", config); }

}  // namespace rlhfd::config

// The verl key tables; see verl_key_tables.h.
#include "common/config/verl_key_tables.h"

#include "absl/strings/match.h"

namespace rlhfd::config::verl_keys {

using Json = nlohmann::json;

// verl key → rlhfd key, copied as they are (values are checked by rlhfd's validator).
const std::vector<std::pair<std::string, std::string>>& DirectTable() {
  static const auto* table = new std::vector<std::pair<std::string, std::string>>{
      {"data.train_files", "data.train_files"},
      {"data.val_files", "data.val_files"},
      {"data.prompt_key", "data.prompt_key"},
      {"data.max_prompt_length", "data.max_prompt_length"},
      {"data.max_response_length", "data.max_response_length"},
      {"data.train_batch_size", "data.train_batch_size"},
      {"data.shuffle", "data.shuffle"},
      {"data.seed", "data.shuffle_seed"},
      {"data.filter_overlong_prompts", "data.filter_overlong_prompts"},
      {"data.truncation", "data.truncation"},
      {"actor_rollout_ref.model.path", "model.path"},
      {"actor_rollout_ref.model.enable_gradient_checkpointing",
       "roles.actor.train.gradient_checkpointing"},
      {"actor_rollout_ref.actor.ppo_mini_batch_size", "roles.actor.train.ppo_mini_batch_size"},
      {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
       "roles.actor.train.ppo_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.actor.use_dynamic_bsz", "roles.actor.train.use_dynamic_bsz"},
      {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
       "roles.actor.train.ppo_max_token_len_per_gpu"},
      {"actor_rollout_ref.actor.ppo_epochs", "roles.actor.train.ppo_epochs"},
      {"actor_rollout_ref.actor.grad_clip", "roles.actor.train.grad_clip"},
      {"actor_rollout_ref.actor.clip_ratio_low", "algorithm.clip_ratio_low"},
      {"actor_rollout_ref.actor.clip_ratio_high", "algorithm.clip_ratio_high"},
      {"actor_rollout_ref.actor.clip_ratio_c", "algorithm.clip_ratio_c"},
      {"actor_rollout_ref.actor.loss_agg_mode", "algorithm.loss_agg_mode"},
      {"actor_rollout_ref.actor.entropy_coeff", "algorithm.entropy_coeff"},
      {"actor_rollout_ref.actor.optim.lr", "roles.actor.train.lr"},
      {"actor_rollout_ref.actor.optim.weight_decay", "roles.actor.train.weight_decay"},
      {"actor_rollout_ref.actor.optim.min_lr_ratio", "roles.actor.train.min_lr_ratio"},
      {"actor_rollout_ref.actor.fsdp_config.param_offload", "roles.actor.train.param_offload"},
      {"actor_rollout_ref.actor.fsdp_config.optimizer_offload",
       "roles.actor.train.optimizer_offload"},
      {"actor_rollout_ref.rollout.temperature", "roles.actor.rollout.temperature"},
      {"actor_rollout_ref.rollout.top_p", "roles.actor.rollout.top_p"},
      {"actor_rollout_ref.rollout.top_k", "roles.actor.rollout.top_k"},
      {"actor_rollout_ref.rollout.n", "roles.actor.rollout.n"},
      {"actor_rollout_ref.rollout.gpu_memory_utilization",
       "roles.actor.rollout.gpu_memory_utilization"},
      {"actor_rollout_ref.rollout.max_num_seqs", "roles.actor.rollout.max_num_seqs"},
      {"actor_rollout_ref.rollout.tensor_model_parallel_size", "roles.actor.rollout.tp"},
      {"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
       "roles.actor.rollout.log_prob_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.rollout.val_kwargs.temperature",
       "roles.actor.rollout.val_kwargs.temperature"},
      {"actor_rollout_ref.rollout.val_kwargs.top_p", "roles.actor.rollout.val_kwargs.top_p"},
      {"actor_rollout_ref.rollout.val_kwargs.top_k", "roles.actor.rollout.val_kwargs.top_k"},
      {"actor_rollout_ref.rollout.val_kwargs.n", "roles.actor.rollout.val_kwargs.n"},
      {"actor_rollout_ref.rollout.val_kwargs.do_sample",
       "roles.actor.rollout.val_kwargs.do_sample"},
      {"actor_rollout_ref.rollout.dtype", "model.dtype"},
      {"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
       "roles.reference.log_prob_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.ref.fsdp_config.param_offload", "roles.reference.param_offload"},
      {"critic.model.path", "roles.critic.model_path"},
      {"critic.model.enable_gradient_checkpointing", "roles.critic.train.gradient_checkpointing"},
      {"critic.model.fsdp_config.param_offload", "roles.critic.train.param_offload"},
      {"critic.model.fsdp_config.optimizer_offload", "roles.critic.train.optimizer_offload"},
      {"critic.optim.lr", "roles.critic.train.lr"},
      {"critic.optim.weight_decay", "roles.critic.train.weight_decay"},
      {"critic.optim.min_lr_ratio", "roles.critic.train.min_lr_ratio"},
      {"critic.ppo_mini_batch_size", "roles.critic.train.ppo_mini_batch_size"},
      {"critic.ppo_micro_batch_size_per_gpu", "roles.critic.train.ppo_micro_batch_size_per_gpu"},
      {"critic.use_dynamic_bsz", "roles.critic.train.use_dynamic_bsz"},
      {"critic.ppo_max_token_len_per_gpu", "roles.critic.train.ppo_max_token_len_per_gpu"},
      {"critic.ppo_epochs", "roles.critic.train.ppo_epochs"},
      {"critic.grad_clip", "roles.critic.train.grad_clip"},
      {"critic.cliprange_value", "roles.critic.train.cliprange_value"},
      {"algorithm.adv_estimator", "algorithm.adv_estimator"},
      {"algorithm.gamma", "algorithm.gamma"},
      {"algorithm.lam", "algorithm.lam"},
      {"algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo"},
      {"trainer.total_epochs", "trainer.total_epochs"},
      {"trainer.total_training_steps", "trainer.total_steps"},
      {"trainer.project_name", "trainer.project_name"},
      {"trainer.experiment_name", "trainer.experiment_name"},
      {"trainer.critic_warmup", "trainer.critic_warmup"},
      {"trainer.val_before_train", "trainer.val_before_train"},
      {"trainer.rollout_data_dir", "trainer.rollout_data_dir"},
      {"trainer.device", "trainer.device"},
      {"trainer.default_local_dir", "trainer.checkpoint_dir"},
  };
  return *table;
}

// Keys whose value does not change what rlhfd computes: dropped with a warning when set.
const std::map<std::string, std::string>& HarmlessTable() {
  static const auto* table = new std::map<std::string, std::string>{
      {"actor_rollout_ref.rollout.name",
       "rlhfd generates with its own engine (continuous batching, CUDA graphs), not vLLM or "
       "SGLang"},
      {"actor_rollout_ref.rollout.mode", "rlhfd's rollout has one mode"},
      {"actor_rollout_ref.rollout.enforce_eager", "CUDA graphs are chosen by the engine"},
      {"actor_rollout_ref.rollout.free_cache_engine",
       "the KV cache is always freed before training"},
      {"actor_rollout_ref.rollout.max_num_batched_tokens", "the engine sizes its own prefills"},
      {"actor_rollout_ref.rollout.enable_chunked_prefill", "the engine sizes its own prefills"},
      {"actor_rollout_ref.rollout.load_format", "weights move by resharding, not loading"},
      {"actor_rollout_ref.rollout.layered_summon", "resharding is layer by layer already"},
      {"actor_rollout_ref.rollout.update_weights_bucket_megabytes", "resharding buckets by 1 GiB"},
      {"actor_rollout_ref.rollout.prompt_length", "data.max_prompt_length is used"},
      {"actor_rollout_ref.rollout.response_length", "data.max_response_length is used"},
      {"actor_rollout_ref.rollout.calculate_log_probs", "rollout log-probs are always kept"},
      {"actor_rollout_ref.rollout.disable_log_stats", "the engine reports its own statistics"},
      {"actor_rollout_ref.rollout.do_sample", "sampling follows temperature (0 is greedy)"},
      {"actor_rollout_ref.rollout.ignore_eos", "responses end at EOS"},
      {"actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "log-probs use fixed micro-batches"},
      {"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
       "log-probs use fixed micro-batches"},
      {"actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "log-probs use fixed micro-batches"},
      {"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "log-probs use fixed micro-batches"},
      {"actor_rollout_ref.model.use_remove_padding",
       "rlhfd computes no padding tokens in packed micro-batches anyway"},
      {"actor_rollout_ref.model.trust_remote_code", "models are implemented natively"},
      {"actor_rollout_ref.model.use_shm", "models load from local disk"},
      {"actor_rollout_ref.model.use_liger", "rlhfd has its own fused kernels"},
      {"actor_rollout_ref.model.use_fused_kernels", "rlhfd has its own fused kernels"},
      {"actor_rollout_ref.actor.use_torch_compile", "no Python here"},
      {"actor_rollout_ref.actor.shuffle", "mini-batches are shuffled with trainer.seed"},
      {"actor_rollout_ref.actor.entropy_from_logits_with_chunking",
       "entropy is always computed in chunks"},
      {"actor_rollout_ref.actor.entropy_checkpointing", "entropy is always computed in chunks"},
      {"actor_rollout_ref.ref.entropy_from_logits_with_chunking",
       "entropy is always computed in chunks"},
      {"actor_rollout_ref.actor.fsdp_config.fsdp_size", "the whole actor pool shards"},
      {"actor_rollout_ref.actor.fsdp_config.reshard_after_forward",
       "layers are always freed after their forward"},
      {"actor_rollout_ref.actor.fsdp_config.forward_prefetch", "gathers are scheduled per layer"},
      {"actor_rollout_ref.actor.fsdp_config.offload_policy", "offload is per role"},
      {"actor_rollout_ref.ref.fsdp_config.reshard_after_forward",
       "layers are always freed after their forward"},
      {"actor_rollout_ref.nccl_timeout", "communicator timeouts are the worker's"},
      {"critic.model.use_remove_padding",
       "rlhfd computes no padding tokens in packed micro-batches anyway"},
      {"critic.model.trust_remote_code", "models are implemented natively"},
      {"critic.model.tokenizer_path", "the actor's tokenizer is used"},
      {"critic.shuffle", "mini-batches are shuffled with trainer.seed"},
      {"critic.forward_max_token_len_per_gpu", "value forwards use fixed micro-batches"},
      {"critic.forward_micro_batch_size_per_gpu", "value forwards use fixed micro-batches"},
      {"critic.rollout_n", "the actor's rollout.n is used"},
      {"critic.enable", "the critic is there exactly when adv_estimator is gae"},
      {"critic.loss_agg_mode", "the critic aggregates as algorithm.loss_agg_mode"},
      {"data.val_batch_size", "validation runs all of data.val_files at once"},
      {"data.dataloader_num_workers", "the controller reads the data itself"},
      {"data.return_raw_chat", "chat prompts are rendered by the worker"},
      {"data.return_raw_input_ids", "chat prompts are rendered by the worker"},
      {"data.return_full_prompt", "chat prompts are rendered by the worker"},
      {"data.filter_overlong_prompts_workers", "the controller reads the data itself"},
      {"data.validation_shuffle", "validation is not shuffled"},
      {"data.reward_fn_key", "rows pick their rule reward by data_source"},
      {"data.use_shm", "data loads from local disk"},
      {"trainer.balance_batch", "rows are dealt to data-parallel ranks evenly"},
      {"trainer.log_val_generations", "validation metrics are logged, not generations"},
      {"trainer.resume_from_path", "resume reads trainer.checkpoint_dir"},
      {"trainer.del_local_ckpt_after_load", "checkpoints are kept"},
      {"trainer.ray_wait_register_center_timeout", "there is no Ray"},
      {"trainer.use_legacy_worker_impl", "there is one worker implementation"},
      {"trainer.esi_redundant_time", "jobs recover from checkpoints by themselves"},
      {"trainer.validation_data_dir", "validation rollouts are not dumped"},
      {"trainer.default_hdfs_dir", "checkpoints go to trainer.checkpoint_dir"},
      {"reward_model.reward_manager", "rule rewards score each row by itself (naive)"},
      {"reward_model.launch_reward_fn_async", "rewards are computed by the reward role"},
      {"reward_model.strategy", "reward models run on the reward role"},
  };
  return *table;
}

// Keys that would change training if ignored: refused, with the reason.
const std::map<std::string, std::string>& UnsupportedTable() {
  static const auto* table = new std::map<std::string, std::string>{
      {"actor_rollout_ref.model.lora_rank", "LoRA is not supported yet; train all parameters"},
      {"actor_rollout_ref.model.custom_chat_template",
       "set model.chat_template (auto, chatml, llama3, none) instead"},
      {"actor_rollout_ref.model.external_lib", "models are implemented natively; none is loaded"},
      {"actor_rollout_ref.model.override_config", "config.json is used as it is"},
      {"actor_rollout_ref.actor.ulysses_sequence_parallel_size",
       "sequence parallelism is not supported"},
      {"actor_rollout_ref.actor.policy_loss.loss_mode",
       "only the vanilla PPO clip loss (with dual clip) is implemented"},
      {"actor_rollout_ref.rollout.multi_turn.enable", "multi-turn rollouts are not supported"},
      {"actor_rollout_ref.rollout.over_sample_rate", "over-sampling is not supported"},
      {"actor_rollout_ref.rollout.skip_rollout", "rollouts are not replayed"},
      {"critic.ulysses_sequence_parallel_size", "sequence parallelism is not supported"},
      {"critic.model.lora_rank", "LoRA is not supported yet"},
      {"critic.model.override_config", "config.json is used as it is"},
      {"algorithm.use_pf_ppo", "PF-PPO reweighting is not implemented"},
      {"algorithm.filter_groups.enable", "DAPO's dynamic sampling is not implemented"},
      {"reward_model.sandbox_fusion.url", "sandboxed code execution is not supported"},
      {"data.custom_cls.path", "datasets are JSONL files (docs/data.md)"},
      {"data.sampler.class_path", "batches are drawn in (shuffled) order"},
      {"data.datagen.path", "datasets are JSONL files (docs/data.md)"},
      {"trainer.val_only", "validation runs inside a training job"},
  };
  return *table;
}

// Values that mean "at verl's default": unset, null, and Hydra interpolations.
bool Unset(const Json& value) {
  return value.is_null() || (value.is_string() && absl::StartsWith(value.get<std::string>(), "${"));
}

// Whether a refused or ignored key's value is the one verl would have anyway.
bool IsVerlNeutral(const std::string& key, const Json& value) {
  if (Unset(value)) return true;
  if (value.is_boolean() && !value.get<bool>()) return true;  // a switch left off
  if (key == "actor_rollout_ref.model.lora_rank" || key == "critic.model.lora_rank" ||
      key == "actor_rollout_ref.rollout.over_sample_rate") {
    return value.is_number() && value.get<double>() == 0;
  }
  if (absl::EndsWith(key, "ulysses_sequence_parallel_size")) {
    return value.is_number() && value.get<double>() == 1;
  }
  if (key == "actor_rollout_ref.actor.policy_loss.loss_mode") {
    return value.is_string() && value.get<std::string>() == "vanilla";
  }
  if (key == "actor_rollout_ref.model.override_config" || key == "critic.model.override_config") {
    return value.is_object() && value.empty();
  }
  if (key == "reward_model.reward_manager") {
    return value.is_string() && value.get<std::string>() == "naive";
  }
  return false;
}

}  // namespace rlhfd::config::verl_keys

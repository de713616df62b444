// The verl key tables; see verl_key_tables.h.
#include "common/config/verl_key_tables.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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
      {"actor_rollout_ref.model.tokenizer_path", "model.tokenizer_path"},
      {"actor_rollout_ref.model.lora_rank", "model.lora_rank"},
      {"actor_rollout_ref.model.lora_alpha", "model.lora_alpha"},
      {"actor_rollout_ref.model.lora_adapter_path", "model.lora_adapter_path"},
      {"actor_rollout_ref.model.enable_gradient_checkpointing",
       "roles.actor.train.gradient_checkpointing"},
      {"actor_rollout_ref.actor.ppo_mini_batch_size", "roles.actor.train.ppo_mini_batch_size"},
      {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
       "roles.actor.train.ppo_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.actor.use_dynamic_bsz", "roles.actor.train.use_dynamic_bsz"},
      {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
       "roles.actor.train.ppo_max_token_len_per_gpu"},
      {"actor_rollout_ref.actor.ppo_epochs", "roles.actor.train.ppo_epochs"},
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
      {"actor_rollout_ref.rollout.update_weights_bucket_megabytes",
       "roles.actor.rollout.update_weights_bucket_megabytes"},
      {"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
       "roles.actor.rollout.update_weights_bucket_megabytes"},
      {"actor_rollout_ref.rollout.multi_turn.enable", "roles.actor.rollout.multi_turn.enable"},
      {"actor_rollout_ref.rollout.multi_turn.tool_config_path",
       "roles.actor.rollout.multi_turn.tool_config_path"},
      {"actor_rollout_ref.rollout.multi_turn.format", "roles.actor.rollout.multi_turn.format"},
      {"actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
       "roles.actor.rollout.multi_turn.max_assistant_turns"},
      {"actor_rollout_ref.rollout.multi_turn.max_user_turns",
       "roles.actor.rollout.multi_turn.max_user_turns"},
      {"actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
       "roles.actor.rollout.multi_turn.max_parallel_calls"},
      {"actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
       "roles.actor.rollout.multi_turn.max_tool_response_length"},
      {"actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side",
       "roles.actor.rollout.multi_turn.tool_response_truncate_side"},
      {"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
       "roles.actor.rollout.log_prob_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
       "roles.actor.rollout.log_prob_use_dynamic_bsz"},
      {"actor_rollout_ref.rollout.enable_prefix_caching",
       "roles.actor.rollout.enable_prefix_caching"},
      {"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
       "roles.actor.rollout.log_prob_max_token_len_per_gpu"},
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
      {"actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
       "roles.reference.log_prob_use_dynamic_bsz"},
      {"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
       "roles.reference.log_prob_max_token_len_per_gpu"},
      {"actor_rollout_ref.ref.fsdp_config.param_offload", "roles.reference.param_offload"},
      {"critic.model.path", "roles.critic.model_path"},
      {"critic.model.enable_gradient_checkpointing", "roles.critic.train.gradient_checkpointing"},
      {"critic.fsdp.param_offload", "roles.critic.train.param_offload"},
      {"critic.fsdp.optimizer_offload", "roles.critic.train.optimizer_offload"},
      {"critic.optim.lr", "roles.critic.train.lr"},
      {"critic.optim.weight_decay", "roles.critic.train.weight_decay"},
      {"critic.optim.min_lr_ratio", "roles.critic.train.min_lr_ratio"},
      {"critic.ppo_mini_batch_size", "roles.critic.train.ppo_mini_batch_size"},
      {"critic.ppo_micro_batch_size_per_gpu", "roles.critic.train.ppo_micro_batch_size_per_gpu"},
      {"critic.use_dynamic_bsz", "roles.critic.train.use_dynamic_bsz"},
      {"critic.ppo_max_token_len_per_gpu", "roles.critic.train.ppo_max_token_len_per_gpu"},
      {"critic.forward_max_token_len_per_gpu", "roles.critic.forward_max_token_len_per_gpu"},
      {"critic.ppo_epochs", "roles.critic.train.ppo_epochs"},
      {"critic.cliprange_value", "roles.critic.train.cliprange_value"},
      {"algorithm.adv_estimator", "algorithm.adv_estimator"},
      {"algorithm.gamma", "algorithm.gamma"},
      {"algorithm.lam", "algorithm.lam"},
      {"algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo"},
      {"algorithm.rollout_correction.rollout_is", "algorithm.rollout_correction.rollout_is"},
      {"algorithm.rollout_correction.rollout_is_threshold",
       "algorithm.rollout_correction.rollout_is_threshold"},
      {"algorithm.rollout_correction.rollout_is_batch_normalize",
       "algorithm.rollout_correction.rollout_is_batch_normalize"},
      {"algorithm.rollout_correction.bypass_mode", "algorithm.rollout_correction.bypass_mode"},
      {"trainer.total_epochs", "trainer.total_epochs"},
      {"trainer.total_training_steps", "trainer.total_steps"},
      {"trainer.project_name", "trainer.project_name"},
      {"trainer.experiment_name", "trainer.experiment_name"},
      {"trainer.critic_warmup", "trainer.critic_warmup"},
      {"trainer.val_before_train", "trainer.val_before_train"},
      {"trainer.val_only", "trainer.val_only"},
      {"trainer.rollout_data_dir", "trainer.rollout_data_dir"},
      {"trainer.log_val_generations", "trainer.log_samples"},
      {"trainer.device", "trainer.device"},
      {"trainer.default_local_dir", "trainer.checkpoint_dir"},
      {"actor_rollout_ref.actor.checkpoint.async_save", "trainer.async_save"},
      // verl's SFT trainer (SftKeyAsPpo).
      {"sft.data.messages_key", "data.messages_key"},
      {"sft.data.tools_key", "data.tools_key"},
      {"sft.data.enable_thinking_key", "data.enable_thinking_key"},
      {"data.apply_chat_template_kwargs.enable_thinking", "data.enable_thinking"},
      {"sft.trainer.seed", "trainer.seed"},
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
      {"actor_rollout_ref.rollout.prompt_length", "data.max_prompt_length is used"},
      {"actor_rollout_ref.rollout.response_length", "data.max_response_length is used"},
      {"actor_rollout_ref.rollout.calculate_log_probs", "rollout log-probs are always kept"},
      {"actor_rollout_ref.rollout.disable_log_stats", "the engine reports its own statistics"},
      {"actor_rollout_ref.rollout.do_sample", "sampling follows temperature (0 is greedy)"},
      {"actor_rollout_ref.rollout.ignore_eos", "responses end at EOS"},
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
      {"critic.forward_micro_batch_size_per_gpu",
       "value forwards take the critic's ppo_micro_batch_size_per_gpu rows (or "
       "forward_max_token_len_per_gpu tokens with use_dynamic_bsz)"},
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
      {"actor_rollout_ref.actor.calculate_entropy", "a metric switch of verl's"},
      {"actor_rollout_ref.actor.calculate_sum_pi_squared", "a metric switch of verl's"},
      {"actor_rollout_ref.actor.data_loader_seed", "mini-batches are shuffled with trainer.seed"},
      {"critic.data_loader_seed", "mini-batches are shuffled with trainer.seed"},
      {"actor_rollout_ref.actor.entropy_from_logits_chunk_size",
       "entropy is always computed in chunks"},
      {"actor_rollout_ref.ref.entropy_from_logits_chunk_size",
       "entropy is always computed in chunks"},
      {"actor_rollout_ref.ref.entropy_checkpointing", "entropy is always computed in chunks"},
      {"actor_rollout_ref.actor.freeze_vision_tower", "rlhfd trains text models"},
      {"actor_rollout_ref.actor.pad_to_length", "micro-batches are packed by rlhfd"},
      {"actor_rollout_ref.actor.use_prefix_grouper", "an optimisation of verl's"},
      {"actor_rollout_ref.actor.optim.optimizer_impl", "rlhfd trains with its own AdamW"},
      {"critic.optim.optimizer_impl", "rlhfd trains with its own AdamW"},
      {"actor_rollout_ref.model.enable_activation_offload", "an option of verl's engine"},
      {"critic.model.enable_activation_offload", "an option of verl's engine"},
      {"critic.model.use_fused_kernels", "rlhfd has its own fused kernels"},
      {"critic.model.use_liger", "rlhfd has its own fused kernels"},
      {"critic.model.use_shm", "models load from local disk"},
      {"actor_rollout_ref.rollout.cudagraph_capture_sizes", "CUDA graphs are chosen by the engine"},
      {"actor_rollout_ref.rollout.data_parallel_size", "rollout replicas follow the GPUs"},
      {"actor_rollout_ref.rollout.full_determinism", "an option of vLLM / SGLang"},
      {"actor_rollout_ref.rollout.max_model_len",
       "lengths come from data.max_prompt_length and max_response_length"},
      {"actor_rollout_ref.rollout.moe_load_balance_metrics_interval", "a metric of verl's"},
      {"actor_rollout_ref.rollout.multi_stage_wake_up", "an option of vLLM / SGLang"},
      {"actor_rollout_ref.rollout.router_config_path", "an option of verl's rollout servers"},
      {"actor_rollout_ref.rollout.scheduling_policy", "the engine schedules its own requests"},
      {"actor_rollout_ref.rollout.seed", "sampling is seeded from trainer.seed"},
      {"actor_rollout_ref.rollout.skip_tokenizer_init", "an option of vLLM / SGLang"},
      {"data.image_key", "rlhfd trains text models"},
      {"data.video_key", "rlhfd trains text models"},
      {"data.audio_key", "rlhfd trains text models"},
      {"data.image_patch_size", "rlhfd trains text models"},
      {"data.mm_processor_kwargs", "rlhfd trains text models"},
      {"data.return_multi_modal_inputs", "rlhfd trains text models"},
      {"data.tokenizer", "the model's tokenizer is used"},
      {"data.trust_remote_code", "the model's tokenizer is implemented natively"},
      {"data.gen_batch_size", "read only with algorithm.filter_groups.enable, which is refused"},
      {"data.custom_cls.name", "read only with data.custom_cls.path, which is refused"},
      {"trainer.checkpoint_callback_class", "checkpoint callbacks are verl's Python"},
      {"trainer.use_v1", "verl's trainer implementation switch"},
      // verl's SFT trainer (SftKeyAsPpo).
      {"sft.data.pad_mode", "micro-batches are packed by rlhfd"},
      {"sft.data.balance_dp_token", "rows are dealt to data-parallel ranks evenly"},
      {"sft.data.num_workers", "the controller reads the data itself"},
      {"sft.data.ignore_input_ids_mismatch",
       "each turn is tokenized by itself, as a rollout makes it; no whole-conversation encoding "
       "is compared with it"},
      {"sft.trainer.profile_interval",
       "verl's profilers are not run; set trainer.profile_steps and trainer.profile_dir for "
       "PyTorch traces of a step's stages"},
  };
  return *table;
}

// Keys that would change training if ignored: refused, with the reason.
const std::map<std::string, std::string>& UnsupportedTable() {
  static const auto* table = new std::map<std::string, std::string>{
      {"actor_rollout_ref.model.custom_chat_template",
       "set model.chat_template (auto, chatml, llama3, none) instead"},
      {"actor_rollout_ref.model.external_lib", "models are implemented natively; none is loaded"},
      {"actor_rollout_ref.model.override_config", "config.json is used as it is"},
      {"actor_rollout_ref.actor.ulysses_sequence_parallel_size",
       "sequence parallelism is not supported"},
      {"actor_rollout_ref.actor.ppo_micro_batch_size",
       "the deprecated global micro-batch size; give ppo_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.rollout.log_prob_micro_batch_size",
       "the deprecated global micro-batch size; give log_prob_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.ref.log_prob_micro_batch_size",
       "the deprecated global micro-batch size; give log_prob_micro_batch_size_per_gpu"},
      {"critic.ppo_micro_batch_size",
       "the deprecated global micro-batch size; give ppo_micro_batch_size_per_gpu"},
      {"actor_rollout_ref.actor.policy_loss.loss_mode",
       "only the vanilla PPO clip loss (with dual clip) is implemented"},
      {"actor_rollout_ref.rollout.multi_turn.function_tool_path",
       "Python function tools are not run; list tools in tool_config_path"},
      {"actor_rollout_ref.rollout.over_sample_rate", "over-sampling is not supported"},
      {"actor_rollout_ref.rollout.skip_rollout", "rollouts are not replayed"},
      {"critic.ulysses_sequence_parallel_size", "sequence parallelism is not supported"},
      {"critic.model.lora_rank", "LoRA critics are not supported yet (the actor's LoRA is)"},
      {"actor_rollout_ref.model.exclude_modules",
       "every decoder layer's target_modules are adapted; name the layers in target_modules"},
      {"critic.model.override_config", "config.json is used as it is"},
      {"algorithm.use_pf_ppo", "PF-PPO reweighting is not implemented"},
      {"algorithm.filter_groups.enable", "DAPO's dynamic sampling is not implemented"},
      {"reward_model.sandbox_fusion.url", "sandboxed code execution is not supported"},
      {"data.custom_cls.path", "datasets are JSONL files (docs/data.md)"},
      {"data.sampler.class_path", "batches are drawn in (shuffled) order"},
      {"data.datagen.path", "datasets are JSONL files (docs/data.md)"},
      {"actor_rollout_ref.actor.loss_scale_factor", "the loss is not rescaled"},
      {"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
       "sequence parallelism is not supported"},
      {"critic.fsdp.ulysses_sequence_parallel_size", "sequence parallelism is not supported"},
      {"actor_rollout_ref.actor.optim.optimizer", "rlhfd trains with AdamW"},
      {"critic.optim.optimizer", "rlhfd trains with AdamW"},
      {"actor_rollout_ref.actor.optim.num_cycles", "the cosine schedule is rlhfd's half cycle"},
      {"critic.optim.num_cycles", "the cosine schedule is rlhfd's half cycle"},
      {"actor_rollout_ref.actor.optim.zero_indexed_step", "the schedule's step count is rlhfd's"},
      {"critic.optim.zero_indexed_step", "the schedule's step count is rlhfd's"},
      {"actor_rollout_ref.actor.optim.override_optimizer_config", "AdamW takes no other options"},
      {"critic.optim.override_optimizer_config", "AdamW takes no other options"},
      {"actor_rollout_ref.model.hf_config_path", "config.json in model.path is used"},
      {"critic.model.hf_config_path", "config.json in the critic's model path is used"},
      {"critic.model.lora_adapter_path",
       "LoRA critics are not supported yet (the actor's LoRA is)"},
      {"critic.model.custom_chat_template", "the actor's chat template is used"},
      {"critic.model.external_lib", "models are implemented natively; none is loaded"},
      {"actor_rollout_ref.rollout.enable_rollout_routing_replay",
       "MoE routing replay is not "
       "supported"},
      {"actor_rollout_ref.rollout.expert_parallel_size", "expert parallelism is not supported"},
      {"actor_rollout_ref.rollout.pipeline_model_parallel_size",
       "pipeline-parallel rollout is not supported"},
      {"actor_rollout_ref.rollout.logprobs_mode", "other rollout log-prob modes are not supported"},
      {"actor_rollout_ref.rollout.quantization", "quantized rollout is not supported"},
      {"actor_rollout_ref.rollout.quantization_config_file", "quantized rollout is not supported"},
      {"algorithm.rollout_correction.rollout_rs", "rollout rejection sampling is not supported"},
      {"algorithm.rollout_correction.loss_type",
       "only the PPO clipped loss (ppo_clip) is supported in bypass mode"},
      {"data.train_max_samples", "every row of data.train_files is read; cut the file instead"},
      {"data.val_max_samples", "every row of data.val_files is read; cut the file instead"},
      {"data.apply_chat_template_kwargs",
       "chat template options other than enable_thinking are not passed"},
      {"sandbox_fusion.url", "sandboxed code execution is not supported"},
      {"reward.sandbox_fusion.url", "sandboxed code execution is not supported"},
      {"distillation.enabled", "distillation from a teacher model is not supported"},
      {"actor_rollout_ref.model.lora.rank",
       "verl's Megatron LoRA section; set lora_rank beside it"},
      {"critic.model.lora.rank", "LoRA critics are not supported yet (the actor's LoRA is)"},
      {"actor_rollout_ref.actor.qat.enable", "quantisation-aware training is not supported"},
      {"actor_rollout_ref.actor.fsdp_config.qat.enable",
       "quantisation-aware training is not supported"},
      {"actor_rollout_ref.model.mtp.enable", "multi-token prediction is not supported"},
      {"critic.model.mtp.enable", "multi-token prediction is not supported"},
      {"skip.rollout.enable", "rollouts are not replayed"},
      {"skip.rollout_tq.enable", "rollouts are not replayed"},
      {"skip.async_rollout.enable", "rollouts are not replayed"},
      {"reward.reward_model.enable",
       "verl 0.9's reward.* section is not converted yet; give reward_model.enable and "
       "reward_model.model.path"},
      // verl's SFT trainer (SftKeyAsPpo).
      {"sft.data.micro_batch_size",
       "the global micro-batch size of verl's old SFT trainer; give "
       "data.micro_batch_size_per_gpu"},
  };
  return *table;
}

// Keys the converter reads and turns into something else.
const std::map<std::string, std::string>& DerivedTable() {
  static const auto* table = new std::map<std::string, std::string>{
      {"sft.data.enable_thinking_default",
       "`data.enable_thinking` when true or false (over "
       "data.apply_chat_template_kwargs.enable_thinking, as in verl); none gives nothing"},
      {"actor_rollout_ref.model.target_modules",
       "`model.target_modules`: a list (verl's string, e.g. all-linear, becomes a list of it)"},
      {"actor_rollout_ref.actor.strategy",
       "`roles.actor.train.zero_stage: 3` for fsdp / fsdp2; megatron is refused"},
      {"critic.strategy",
       "`roles.critic.train.zero_stage: 3` for fsdp / fsdp2; megatron is refused"},
      {"actor_rollout_ref.actor.optim.lr_scheduler_type",
       "`roles.actor.train.lr_schedule` (constant, cosine) unless warmup_style is set"},
      {"actor_rollout_ref.actor.optim.warmup_style",
       "`roles.actor.train.lr_schedule` when set (verl's deprecated name wins, as in verl)"},
      {"critic.optim.lr_scheduler_type",
       "`roles.critic.train.lr_schedule` (constant, cosine) unless warmup_style is set"},
      {"critic.optim.warmup_style",
       "`roles.critic.train.lr_schedule` when set (verl's deprecated name wins, as in verl)"},
      {"actor_rollout_ref.actor.optim.betas", "`roles.actor.train.adam_beta1`, `adam_beta2`"},
      {"critic.optim.betas", "`roles.critic.train.adam_beta1`, `adam_beta2`"},
      {"actor_rollout_ref.actor.optim.clip_grad",
       "`roles.actor.train.grad_clip` unless optim.grad_clip is set"},
      {"actor_rollout_ref.actor.optim.grad_clip",
       "`roles.actor.train.grad_clip` when set (verl's deprecated name wins, as in verl)"},
      {"critic.optim.clip_grad", "`roles.critic.train.grad_clip` unless optim.grad_clip is set"},
      {"critic.optim.grad_clip",
       "`roles.critic.train.grad_clip` when set (verl's deprecated name wins, as in verl)"},
      {"actor_rollout_ref.actor.grad_clip",
       "not read by verl 0.9 (its engine clips with optim.clip_grad); listed when set"},
      {"critic.grad_clip",
       "not read by verl 0.9 (its engine clips with optim.clip_grad); listed when set"},
      {"actor_rollout_ref.actor.optim.lr_warmup_steps",
       "`roles.actor.train.lr_warmup_steps` when >= 0"},
      {"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
       "× trainer.total_training_steps: `roles.actor.train.lr_warmup_steps` when "
       "lr_warmup_steps < 0"},
      {"actor_rollout_ref.actor.optim.total_training_steps", "filled in by verl at run time"},
      {"critic.optim.lr_warmup_steps", "`roles.critic.train.lr_warmup_steps` when >= 0"},
      {"critic.optim.lr_warmup_steps_ratio",
       "× trainer.total_training_steps: `roles.critic.train.lr_warmup_steps` when "
       "lr_warmup_steps < 0"},
      {"critic.optim.total_training_steps", "filled in by verl at run time"},
      {"actor_rollout_ref.actor.clip_ratio",
       "`algorithm.clip_ratio_low` / `_high` where clip_ratio_low / _high are null (verl's "
       "rule); listed when it is set and they are not"},
      {"actor_rollout_ref.actor.use_kl_loss",
       "`algorithm.kl.mode: loss` and a `roles.reference` (with use_kl_in_reward: refused)"},
      {"algorithm.use_kl_in_reward", "`algorithm.kl.mode: in_reward` and a `roles.reference`"},
      {"actor_rollout_ref.actor.kl_loss_coef", "`algorithm.kl.coef` with use_kl_loss"},
      {"actor_rollout_ref.actor.kl_loss_type",
       "`algorithm.kl.estimator` with use_kl_loss (kl/k1, mse/k2, low_var_kl/k3)"},
      {"algorithm.kl_penalty",
       "`algorithm.kl.estimator` with use_kl_in_reward (kl/k1, mse/k2, low_var_kl/k3)"},
      {"algorithm.kl_ctrl.type", "`algorithm.kl.controller` with use_kl_in_reward"},
      {"algorithm.kl_ctrl.kl_coef", "`algorithm.kl.coef` with use_kl_in_reward"},
      {"algorithm.kl_ctrl.target_kl", "`algorithm.kl.target` with use_kl_in_reward"},
      {"algorithm.kl_ctrl.horizon", "`algorithm.kl.horizon` with use_kl_in_reward"},
      {"actor_rollout_ref.rollout.tensor_model_parallel_size", "`roles.actor.rollout.tp`"},
      {"trainer.n_gpus_per_node", "× trainer.nnodes: `roles.actor.gpus` (every role shares them)"},
      {"trainer.nnodes", "× trainer.n_gpus_per_node: `roles.actor.gpus`"},
      {"actor_rollout_ref.hybrid_engine",
       "`placement: colocated`; false is refused (give rlhfd's placement: split instead)"},
      {"custom_reward_function.path",
       "`roles.reward.custom_reward_function.path` (a Python compute_score, docs/rewards.md), "
       "with reward_kwargs.*; refused beside reward_model.enable, as verl leaves it unused"},
      {"custom_reward_function.name",
       "`roles.reward.custom_reward_function.name` with its path (default compute_score)"},
      {"reward.custom_reward_function.path",
       "`roles.reward.custom_reward_function.path` when the top-level custom_reward_function "
       "names none (verl 0.9's layout)"},
      {"reward.custom_reward_function.name",
       "`roles.reward.custom_reward_function.name` with its path"},
      {"reward_model.enable",
       "with reward_model.model.path: `roles.reward.model`; else "
       "`roles.reward.rule: auto` (by data_source, verl's default reward)"},
      {"reward_model.model.path", "`roles.reward.model` with reward_model.enable"},
      {"reward_model.model.input_tokenizer",
       "the actor's tokenizer renders the reward model's "
       "input"},
      {"trainer.save_freq",
       "`trainer.save_every` (-1: never, as verl's PPO trainer; from verl's SFT trainer, which "
       "saves after its last step whatever it is, 0: after the last step)"},
      {"trainer.max_actor_ckpt_to_keep",
       "the larger with max_critic_ckpt_to_keep: `trainer.max_ckpt_to_keep` (a step holds both)"},
      {"trainer.max_critic_ckpt_to_keep",
       "the larger with max_actor_ckpt_to_keep: `trainer.max_ckpt_to_keep` (a step holds both)"},
      {"trainer.test_freq",
       "`trainer.val_every` (-1 is 0); rlhfd also validates after the last step"},
      {"trainer.resume_mode", "`trainer.resume` (auto: true, disable: false; resume_path refused)"},
      {"trainer.logger",
       "`trainer.loggers` (console, file as jsonl, tensorboard); others are listed and left out"},
      // verl's copies of a key for another section: rlhfd reads the original.
      {"actor_rollout_ref.actor.rollout_n", "verl's copy of rollout.n"},
      {"actor_rollout_ref.ref.rollout_n", "verl's copy of rollout.n"},
      {"actor_rollout_ref.actor.use_fused_kernels", "verl's copy of model.use_fused_kernels"},
      {"actor_rollout_ref.actor.use_remove_padding", "verl's copy of model.use_remove_padding"},
      {"actor_rollout_ref.ref.strategy", "verl's copy of actor.strategy"},
      {"actor_rollout_ref.ref.use_torch_compile", "verl's copy of actor.use_torch_compile"},
      {"actor_rollout_ref.ref.ulysses_sequence_parallel_size",
       "verl's copy of actor.ulysses_sequence_parallel_size"},
      {"actor_rollout_ref.ref.pad_to_length", "verl's copy of actor.pad_to_length"},
      {"actor_rollout_ref.rollout.n_gpus_per_node",
       "× rollout.nnodes: `roles.rollout.gpus` when nnodes > 0; else verl's copy of "
       "trainer.n_gpus_per_node"},
      {"actor_rollout_ref.rollout.nnodes",
       "> 0 (verl's standalone rollout): × rollout.n_gpus_per_node GPUs of their own, "
       "`roles.rollout.gpus`; 0 (verl's default): the hybrid engine"},
      {"actor_rollout_ref.rollout.mtp", "verl's copy of model.mtp"},
      {"actor_rollout_ref.rollout.qat", "verl's copy of actor.fsdp_config.qat"},
      {"critic.forward_micro_batch_size", "verl's copy of critic.ppo_micro_batch_size"},
      {"critic.loss_scale_factor", "verl's copy of actor.loss_scale_factor"},
      {"data.function_tool_path", "verl's copy of rollout.multi_turn.function_tool_path"},
      {"data.tool_config_path", "verl's copy of rollout.multi_turn.tool_config_path"},
      // verl's SFT trainer (SftKeyAsPpo).
      {"sft.data.train_batch_size",
       "`data.train_batch_size` and `roles.actor.train.ppo_mini_batch_size`: one optimiser step "
       "per batch, as verl's SFT trainer takes"},
      {"sft.data.max_length",
       "`data.max_prompt_length` and `data.max_response_length` both: verl bounds a "
       "conversation's prompt and response together, rlhfd each, so under data.truncation "
       "error every conversation verl trains is trained alike; truncation left or right (verl "
       "cuts the end of the whole conversation) is refused"},
      {"sft.trainer.max_ckpt_to_keep",
       "`trainer.max_ckpt_to_keep` (null or <= 0: all, as in verl)"},
      {"sft.data.multiturn.enable",
       "false (verl's old single-turn SFTDataset): rows are read with `data.prompt_key` and "
       "`data.response_key` from prompt_key, response_key and their *_dict_keys (defaults "
       "question, answer)"},
      {"sft.data.prompt_key",
       "single-turn rows: `data.prompt_key`, followed by prompt_dict_keys as a dotted path"},
      {"sft.data.prompt_dict_keys", "single-turn rows: the rest of `data.prompt_key`'s path"},
      {"sft.data.response_key",
       "single-turn rows: `data.response_key`, followed by response_dict_keys as a dotted path"},
      {"sft.data.response_dict_keys", "single-turn rows: the rest of `data.response_key`'s path"},
  };
  return *table;
}

const std::vector<std::pair<std::string, std::string>>& IgnoredFamilyTable() {
  static const auto* table = new std::vector<std::pair<std::string, std::string>>{
      {"._target_", "the Python class verl builds the section as"},
      {"_target_", "the Python class verl builds the section as"},
      {"hydra.", "Hydra's own settings"},
      {"defaults", "Hydra's composition list"},
      {"global_profiler.",
       "verl's profilers are not run; set trainer.profile_steps and trainer.profile_dir for "
       "PyTorch traces of a step's stages"},
      {".profiler.",
       "verl's profilers are not run; set trainer.profile_steps and trainer.profile_dir for "
       "PyTorch traces of a step's stages"},
      {".checkpoint.", "rlhfd checkpoints model, optimizer and RNG state per rank, always"},
      {"ray_kwargs.", "there is no Ray"},
      {"ray_init.", "there is no Ray"},
      {"transfer_queue.", "verl's Ray data transfer; rlhfd moves tensors over its communicator"},
      {".turbo_config.", "options of verl's FSDP engine"},
      {".engine_kwargs.", "options of vLLM / SGLang / TensorRT-LLM"},
      {".wrap_policy.", "rlhfd shards every decoder layer"},
      {"distillation.", "read only with distillation.enabled, which is refused"},
      {".qat.", "read only with qat.enable, which is refused"},
      {".mtp.", "read only with mtp.enable, which is refused"},
      {".lora.", "read only with lora.rank > 0, which is refused"},
      {"trainer.v1.", "verl's experimental v1 trainer"},
      {"skip.", "read only with skip.*.enable, which is refused"},
      {".agent.",
       "verl's agent-loop workers; rlhfd's agent loop runs inside the rollout (multi_turn.enable)"},
      {".multi_turn.",
       "not read by rlhfd's agent loop (it tokenizes turns itself and never repeats rollouts)"},
      {".trace.", "rollout tracing is verl's"},
      {".prometheus.", "the controller serves its own /metrics"},
      {".disaggregation.", "prefill/decode disaggregation is vLLM's"},
      {".policy_loss.", "parameters of policy losses other than PPO's clip, which are refused"},
      {"actor_rollout_ref.actor.tau_",
       "parameters of policy losses other than PPO's clip, which "
       "are refused"},
      {"algorithm.filter_groups.", "read only with filter_groups.enable, which is refused"},
      {"algorithm.pf_ppo.", "read only with use_pf_ppo, which is refused"},
      {"algorithm.rollout_correction.rollout_rs_threshold",
       "read only with rollout_rs, which is refused"},
      {".fsdp_config.", "an option of verl's FSDP engine; rlhfd's ZeRO training has its own"},
      {"critic.fsdp.", "an option of verl's FSDP engine; rlhfd's ZeRO training has its own"},
      {".tiled_mlp.", "an option of verl's engine"},
      {".fused_kernel_options.", "rlhfd has its own fused kernels"},
      {".checkpoint_engine.", "weights move to the rollout by resharding"},
      {"critic.model.lora_alpha", "read only with a LoRA critic, which is refused"},
      {"critic.model.target_modules", "read only with a LoRA critic, which is refused"},
      {"critic.model.exclude_modules", "read only with a LoRA critic, which is refused"},
      {"reward_model.",
       "an option of verl's reward-model workers; rlhfd's reward role runs the "
       "model itself"},
      {"reward.", "verl 0.9's reward section is not converted yet (reward_model.* is)"},
      {"sandbox_fusion.", "sandboxed code execution is not supported"},
  };
  return *table;
}

const std::string* IgnoredFamily(const std::string& key) {
  for (const auto& [part, why] : IgnoredFamilyTable()) {
    const bool match = part.front() == '.' ? absl::StrContains(key, part) ||
                                                 (part.back() != '.' && absl::EndsWith(key, part))
                                           : absl::StartsWith(key, part) || key == part;
    if (match) return &why;
  }
  return nullptr;
}

std::string Fate(const std::string& key) {
  for (const auto& [from, to] : DirectTable()) {
    if (from == key) return absl::StrCat("mapped to `", to, "`");
  }
  if (auto it = DerivedTable().find(key); it != DerivedTable().end()) {
    return absl::StrCat("derived: ", it->second);
  }
  if (auto it = UnsupportedTable().find(key); it != UnsupportedTable().end()) {
    return absl::StrCat("refused unless at verl's default: ", it->second);
  }
  if (auto it = HarmlessTable().find(key); it != HarmlessTable().end()) {
    return absl::StrCat("ignored: ", it->second);
  }
  if (const std::string* why = IgnoredFamily(key)) return absl::StrCat("ignored: ", *why);
  return "not read by rlhfd; listed as ignored when a run sets it";
}

namespace {

// SFT key (or prefix, ending in '.') → its PPO name; the first that matches wins.
constexpr std::pair<const char*, const char*> kSftAsPpo[] = {
    {"data.micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"},
    {"data.max_token_len_per_gpu", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"},
    {"data.use_dynamic_bsz", "actor_rollout_ref.actor.use_dynamic_bsz"},
    {"engine.strategy", "actor_rollout_ref.actor.strategy"},
    {"model.", "actor_rollout_ref.model."},
    {"optim.", "actor_rollout_ref.actor.optim."},
    {"engine.", "actor_rollout_ref.actor.fsdp_config."},
    {"checkpoint.", "actor_rollout_ref.actor.checkpoint."},
    {"profiler.", "actor_rollout_ref.actor.profiler."},
};

// The SFT trainer's own keys (or prefixes), and those that mean something else there: "sft." +
// the key. The last six are verl's old SFT trainer's.
constexpr const char* kSftOwn[] = {
    "data.messages_key",
    "data.tools_key",
    "data.enable_thinking_key",
    "data.enable_thinking_default",
    "data.pad_mode",
    "data.max_length",
    "data.balance_dp_token",
    "data.num_workers",
    "data.ignore_input_ids_mismatch",
    "data.train_batch_size",
    "trainer.seed",
    "trainer.max_ckpt_to_keep",
    "trainer.profile_interval",
    "data.prompt_key",
    "data.response_key",
    "data.prompt_dict_keys",
    "data.response_dict_keys",
    "data.micro_batch_size",
    "data.multiturn.",
};

bool Matches(const std::string& key, absl::string_view pattern) {
  return pattern.back() == '.' ? absl::StartsWith(key, pattern) : key == pattern;
}

constexpr char kSftOwnPrefix[] = "sft.";

}  // namespace

std::string SftKeyAsPpo(const std::string& key) {
  for (const char* own : kSftOwn) {
    if (Matches(key, own)) return absl::StrCat(kSftOwnPrefix, key);
  }
  for (const auto& [sft, ppo] : kSftAsPpo) {
    if (Matches(key, sft)) return absl::StrCat(ppo, key.substr(std::string_view(sft).size()));
  }
  return key;
}

std::string PpoKeyAsSft(const std::string& key) {
  if (absl::StartsWith(key, kSftOwnPrefix)) return key.substr(sizeof(kSftOwnPrefix) - 1);
  for (const auto& [sft, ppo] : kSftAsPpo) {
    if (Matches(key, ppo)) return absl::StrCat(sft, key.substr(std::string_view(ppo).size()));
  }
  return key;
}

const std::map<std::string, std::string>& LegacySftRenames() {
  static const auto* table = new std::map<std::string, std::string>{
      {"model.partial_pretrain", "model.path"},
      {"model.strategy", "engine.strategy"},
      {"data.multiturn.messages_key", "data.messages_key"},
      {"data.multiturn.tools_key", "data.tools_key"},
      {"data.multiturn.enable_thinking_key", "data.enable_thinking_key"},
      {"optim.warmup_steps_ratio", "optim.lr_warmup_steps_ratio"},
      {"optim.lr_scheduler", "optim.lr_scheduler_type"},
      {"ulysses_sequence_parallel_size", "engine.ulysses_sequence_parallel_size"},
      {"use_remove_padding", "model.use_remove_padding"},
  };
  return *table;
}

bool Known(const std::string& key) {
  for (const auto& [from, to] : DirectTable()) {
    if (from == key) return true;
  }
  return DerivedTable().count(key) || HarmlessTable().count(key) || UnsupportedTable().count(key);
}

std::string RefusedParent(const std::string& key) {
  for (size_t dot = key.rfind('.'); dot != std::string::npos && dot > 0;
       dot = key.rfind('.', dot - 1)) {
    std::string parent = key.substr(0, dot);
    if (UnsupportedTable().count(parent)) return parent;
  }
  return "";
}

// Values that mean "not given": null (interpolations are resolved before the tables are read).
bool Unset(const Json& value) { return value.is_null(); }

// Whether a refused or ignored key's value is the one verl would have anyway.
bool IsVerlNeutral(const std::string& key, const Json& value) {
  if (Unset(value)) return true;
  if (value.is_boolean() && !value.get<bool>()) return true;  // a switch left off
  if (absl::EndsWith(key, "lora_rank") || absl::EndsWith(key, "lora.rank") ||
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

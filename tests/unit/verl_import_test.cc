// verl configs in: the verl trainer layout and Hydra overrides converted to rlhfd configs, every
// supported key landing where the mapping says, every unsupported one named; overrides on rlhfd
// configs; the printed effective config. The verl inputs are written here from verl's key names.
#include "common/config/verl_import.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/config_printer.h"
#include "common/config/job_config.h"
#include "common/config/proto_json_schema.h"
#include "common/config/verl_key_tables.h"

namespace rlhfd::config {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using Json = nlohmann::json;

VerlConversion Convert(const std::string& text, const std::vector<std::string>& overrides = {},
                       VerlTrainer trainer = VerlTrainer::kPpo) {
  auto converted = ConvertVerlConfig(text, "verl.yaml", overrides, trainer);
  INFO(converted.status().ToString());
  REQUIRE(converted.ok());
  return *std::move(converted);
}

// The converted config, with a model and data the validator accepts, loaded like a submission.
v1::JobSpec Validated(const VerlConversion& conversion) {
  INFO("errors: " << absl::StrJoin(conversion.errors, "; "));
  REQUIRE(conversion.errors.empty());
  auto loaded = LoadConfig(conversion.config.dump(), "verl.json",
                           {"model.path=/models/m", "data.train_files=[/data/train.jsonl]"});
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  return loaded->spec;
}

const nlohmann::json* At(const nlohmann::json& document, const std::string& path) {
  const nlohmann::json* node = &document;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(path, '.'))) {
    if (!node->is_object() || !node->contains(part)) return nullptr;
    node = &(*node)[part];
  }
  return node;
}

bool Contains(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& line : lines) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

// GRPO as verl's examples run it: KL as a loss, low_var_kl, rollout with vLLM, one node.
constexpr char kVerlGrpo[] = R"(
data:
  train_files: /data/gsm8k/train.jsonl
  val_files: /data/gsm8k/test.jsonl
  train_batch_size: 64
  max_prompt_length: 512
  max_response_length: 1024
  filter_overlong_prompts: True
  truncation: error
actor_rollout_ref:
  model:
    path: /models/Qwen2.5-0.5B-Instruct
    use_remove_padding: True
    enable_gradient_checkpointing: True
  actor:
    optim: {lr: 1e-6}
    ppo_mini_batch_size: 16
    ppo_micro_batch_size_per_gpu: 4
    use_kl_loss: True
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
    entropy_coeff: 0
    fsdp_config: {param_offload: False, optimizer_offload: False}
  rollout:
    name: vllm
    tensor_model_parallel_size: 1
    gpu_memory_utilization: 0.6
    n: 4
    log_prob_micro_batch_size_per_gpu: 8
  ref:
    log_prob_micro_batch_size_per_gpu: 8
    fsdp_config: {param_offload: True}
algorithm:
  adv_estimator: grpo
  use_kl_in_reward: False
trainer:
  critic_warmup: 0
  logger: [console, wandb]
  project_name: verl_grpo_example_gsm8k
  experiment_name: qwen2.5_0.5b_function_rm
  n_gpus_per_node: 2
  nnodes: 1
  save_freq: 20
  test_freq: 5
  total_epochs: 15
)";

// verl's SFT trainer (python -m verl.trainer.sft_trainer): its config in overrides, as its run
// scripts give them.
VerlConversion ConvertSft(const std::vector<std::string>& overrides) {
  return Convert("", overrides, VerlTrainer::kSft);
}

TEST_CASE("verl's SFT trainer at its defaults converts to an SFT job with verl's values",
          "[verl][sft]") {
  const VerlConversion converted = ConvertSft({"trainer.logger=[console]"});
  INFO(absl::StrJoin(converted.warnings, "\n"));
  CHECK(converted.errors.empty());
  // Only: verl's SFT trainer takes its GPUs from torchrun, which the config does not say.
  REQUIRE(converted.warnings.size() == 1);
  CHECK(Contains(converted.warnings,
                 "trainer.n_gpus_per_node: ignored (verl's SFT trainer runs "
                 "on torchrun's processes"));
  const v1::JobSpec spec = Validated(converted);
  CHECK(spec.trainer().mode() == v1::TRAINER_MODE_SFT);
  // verl 0.9.1's sft_trainer_engine.yaml with model: hf_model, engine: fsdp, optim: fsdp.
  const v1::TrainSpec& train = spec.roles().actor().train();
  CHECK(train.lr() == Approx(1e-3));
  CHECK(train.weight_decay() == Approx(0.01));
  CHECK(train.grad_clip() == Approx(1.0));
  CHECK(train.lr_schedule() == v1::LR_SCHEDULE_CONSTANT);
  CHECK(train.gradient_checkpointing());
  CHECK(train.use_dynamic_bsz());
  CHECK(train.ppo_max_token_len_per_gpu() == 8192);
  CHECK(train.ppo_micro_batch_size_per_gpu() == 4);
  CHECK(train.zero_stage() == 3);
  // One optimiser step per batch of conversations.
  CHECK(spec.data().train_batch_size() == 256);
  CHECK(train.ppo_mini_batch_size() == 256);
  CHECK(train.ppo_epochs() == 1);
  CHECK(spec.data().max_prompt_length() == 1024);  // data.max_length
  CHECK(spec.data().max_response_length() == 1024);
  CHECK(spec.data().truncation() == v1::TRUNCATION_ERROR);
  CHECK(spec.data().messages_key() == "messages");
  CHECK(spec.data().tools_key() == "tools");
  CHECK(spec.data().response_key().empty());  // conversations, not single-turn rows
  CHECK(spec.roles().actor().gpus() == 1);
  CHECK(spec.trainer().total_epochs() == 4);
  CHECK(spec.trainer().save_every() == 0);  // after the last step, as verl's SFT trainer
  CHECK(spec.trainer().seed() == 1);
  CHECK(spec.trainer().project_name() == "gsm8k-sft");
  CHECK(spec.trainer().checkpoint_dir() == "checkpoints/gsm8k-sft/test");
  CHECK_FALSE(spec.roles().has_reference());
  CHECK_FALSE(spec.roles().has_critic());
  CHECK(Contains(converted.mapped, "optim.lr -> roles.actor.train.lr"));
  CHECK(Contains(converted.mapped,
                 "data.micro_batch_size_per_gpu -> "
                 "roles.actor.train.ppo_micro_batch_size_per_gpu"));
  // Every key the converter read is named as the SFT config names it.
  for (const std::string& key : converted.read) {
    INFO(key);
    CHECK_FALSE(absl::StartsWith(key, "actor_rollout_ref."));
    CHECK_FALSE(absl::StartsWith(key, "sft."));
  }
}

// verl's multi-turn SFT example (examples/sft/multiturn, ReTool's cold start), in the names of
// verl 0.9.1's sft_trainer and in those of the older fsdp_sft_trainer the script was written for.
TEST_CASE("verl's multi-turn SFT example converts in both trainers' names", "[verl][sft]") {
  const std::vector<std::string> common = {"data.max_length=16384",
                                           "data.train_batch_size=128",
                                           "data.micro_batch_size_per_gpu=16",
                                           "data.train_files=/data/retool/train.parquet",
                                           "optim.lr=1e-6",
                                           "trainer.default_local_dir=/ckpt/retool-sft",
                                           "trainer.project_name=retool-multiturn-sft",
                                           "trainer.experiment_name=qwen3-4b",
                                           "trainer.logger=[console]",
                                           "trainer.total_epochs=12",
                                           "trainer.n_gpus_per_node=8"};
  std::vector<std::string> current = common, old = common;
  for (const char* item :
       {"data.messages_key=messages", "data.tools_key=tools", "model.path=/models/Qwen3-4B",
        "model.trust_remote_code=true", "engine.ulysses_sequence_parallel_size=1",
        "optim.lr_scheduler_type=cosine", "optim.lr_warmup_steps_ratio=0",
        "optim.betas=[0.9,0.95]"}) {
    current.push_back(item);
  }
  // The old trainer's script as verl's example has it: its keys, on its defaults.
  for (const char* item :
       {"data.multiturn.enable=true", "data.multiturn.messages_key=messages",
        "data.multiturn.tools_key=tools", "model.partial_pretrain=/models/Qwen3-4B",
        "model.trust_remote_code=true", "ulysses_sequence_parallel_size=1",
        "use_remove_padding=true"}) {
    old.push_back(item);
  }
  // Where the old trainer's defaults differ from verl 0.9.1's, a conversion on 0.9.1's would
  // silently train otherwise (betas, the warmup, the schedule): each is refused until given.
  const VerlConversion on_old_defaults = ConvertSft(old);
  for (const char* refused :
       {"optim.betas: not supported (the run uses verl's old SFT trainer's keys, whose default "
        "for it is [0.9, 0.95], verl 0.9.1's [0.9,0.999]: give it)",
        "optim.lr_warmup_steps_ratio: not supported", "optim.lr_scheduler_type: not supported"}) {
    INFO(absl::StrJoin(on_old_defaults.errors, "\n"));
    CHECK(Contains(on_old_defaults.errors, refused));
  }
  CHECK(on_old_defaults.errors.size() == 3);  // optim.lr is given
  for (const char* item :
       {"optim.lr_scheduler=cosine", "optim.warmup_steps_ratio=0", "optim.betas=[0.9,0.95]"}) {
    old.push_back(item);
  }
  const VerlConversion now = ConvertSft(current);
  const VerlConversion before = ConvertSft(old);
  for (const VerlConversion* converted : {&now, &before}) {
    CHECK(converted->errors.empty());
    CHECK(Contains(converted->warnings,
                   "model.trust_remote_code: ignored (models are implemented "
                   "natively)"));
    const v1::JobSpec spec = Validated(*converted);
    CHECK(spec.trainer().mode() == v1::TRAINER_MODE_SFT);
    CHECK(converted->config["model"]["path"] == "/models/Qwen3-4B");
    CHECK(spec.data().max_prompt_length() == 16384);
    CHECK(spec.data().max_response_length() == 16384);
    CHECK(spec.data().train_batch_size() == 128);
    CHECK(spec.roles().actor().train().ppo_mini_batch_size() == 128);
    CHECK(spec.roles().actor().train().ppo_micro_batch_size_per_gpu() == 16);
    CHECK(spec.roles().actor().train().lr() == Approx(1e-6));
    CHECK(spec.roles().actor().gpus() == 8);
    CHECK(spec.trainer().total_epochs() == 12);
    CHECK(spec.trainer().checkpoint_dir() == "/ckpt/retool-sft");
    CHECK(spec.name() == "qwen3-4b");
  }
  // The converted jobs are the same; the old names are listed as the run gave them.
  CHECK(now.config == before.config);
  CHECK(Contains(before.mapped, "model.partial_pretrain -> model.path"));
  CHECK(Contains(before.mapped, "data.multiturn.messages_key -> data.messages_key"));
  CHECK(Contains(before.mapped, "optim.lr_scheduler -> roles.actor.train.lr_schedule"));
  // Sequence parallelism, in either name, is refused naming the key as the run gave it.
  CHECK(Contains(ConvertSft({"ulysses_sequence_parallel_size=4"}).errors,
                 "ulysses_sequence_parallel_size: not supported (sequence parallelism is not "
                 "supported)"));
  CHECK(Contains(ConvertSft({"engine.ulysses_sequence_parallel_size=4"}).errors,
                 "engine.ulysses_sequence_parallel_size: not supported"));
  // Both names given: verl 0.9.1's wins, even at its default value, and the old one is listed.
  const VerlConversion twice =
      ConvertSft({"model.path=/models/new", "model.partial_pretrain=/models/old",
                  "data.use_dynamic_bsz=true", "data.micro_batch_size_per_gpu=4",
                  "optim.lr_scheduler_type=constant", "optim.lr_scheduler=cosine"});
  CHECK(twice.config["model"]["path"] == "/models/new");
  CHECK(twice.config["roles"]["actor"]["train"]["lr_schedule"] == "constant");
  CHECK(Contains(twice.warnings,
                 "optim.lr_scheduler: ignored (the old SFT trainer's name of a key "
                 "the run also gives as verl 0.9.1's)"));
}

// verl's old single-turn SFT (examples/sft/gsm8k/run_qwen_05_peft.sh): the question and the answer
// inside each row's extra_info, a LoRA adapter.
TEST_CASE("verl's old single-turn SFT example converts to prompt and response paths",
          "[verl][sft]") {
  const VerlConversion converted = ConvertSft(
      {"data.train_files=/data/gsm8k/train.parquet", "data.prompt_key=extra_info",
       "data.response_key=extra_info", "optim.lr=1e-4", "data.prompt_dict_keys=['question']",
       "+data.response_dict_keys=['answer']", "data.micro_batch_size_per_gpu=4",
       "model.partial_pretrain=/models/Qwen2.5-0.5B-Instruct", "trainer.logger=['console']",
       "trainer.total_epochs=1", "trainer.default_hdfs_dir=null", "model.lora_rank=32",
       "model.lora_alpha=16", "model.target_modules=all-linear",
       // The old trainer's defaults, which differ from verl 0.9.1's (refused unless given).
       "optim.betas=[0.9,0.95]", "optim.warmup_steps_ratio=0", "optim.lr_scheduler=cosine",
       "trainer.n_gpus_per_node=2"});
  INFO(absl::StrJoin(converted.warnings, "\n"));
  CHECK(converted.errors.empty());
  CHECK(converted.warnings.empty());
  const v1::JobSpec spec = Validated(converted);
  CHECK(spec.data().prompt_key() == "extra_info.question");
  CHECK(spec.data().response_key() == "extra_info.answer");
  CHECK(spec.model().lora_rank() == 32);
  CHECK(spec.model().lora_alpha() == Approx(16));
  CHECK(spec.trainer().total_epochs() == 1);
  // Without the keys, the old trainer's defaults: question and answer at the top of each row.
  const VerlConversion defaults = ConvertSft({"data.multiturn.enable=false"});
  CHECK(defaults.config["data"]["prompt_key"] == "question");
  CHECK(defaults.config["data"]["response_key"] == "answer");
  // With multi-turn on, single-turn keys are listed as unread.
  const VerlConversion both = ConvertSft({"data.multiturn.enable=true", "data.prompt_key=q"});
  CHECK(Contains(both.warnings,
                 "data.prompt_key: ignored (read by verl's old SFT trainer for "
                 "single-turn rows only"));
  CHECK_FALSE(both.config["data"].contains("response_key"));
}

TEST_CASE("verl SFT settings rlhfd cannot honour are refused or listed, each naming its key",
          "[verl][sft]") {
  const VerlConversion refused =
      ConvertSft({"data.truncation=right", "trainer.save_freq=after_each_epoch",
                  "data.custom_cls.path=x.py", "+data.apply_chat_template_kwargs.add_bos=true",
                  "engine.strategy=megatron", "optim.optimizer=SGD",
                  "data.enable_thinking_default=maybe", "trainer.test_freq=after_each_epoch"});
  for (const char* key :
       {"data.truncation: not supported ('right' with data.max_length: verl cuts the end",
        "trainer.save_freq: not supported ('after_each_epoch': give a number of steps",
        "trainer.test_freq: not supported ('after_each_epoch': give a number of steps",
        "data.custom_cls.path: not supported",
        "data.apply_chat_template_kwargs: not supported (chat template options other than "
        "enable_thinking are not passed)",
        "engine.strategy: not supported ('megatron'", "optim.optimizer: not supported",
        "data.enable_thinking_default: not supported ('maybe': true, false or none)"}) {
    INFO(key << "\n" << absl::StrJoin(refused.errors, "\n"));
    CHECK(Contains(refused.errors, key));
  }
  CHECK(refused.errors.size() == 8);
  // Qwen3's thinking switch: a row's own value (enable_thinking_key), else the default, else
  // apply_chat_template_kwargs', as verl's MultiTurnSFTDataset reads them.
  const VerlConversion thinking =
      ConvertSft({"+data.apply_chat_template_kwargs.enable_thinking=true",
                  "data.enable_thinking_default=false", "data.enable_thinking_key=think"});
  CHECK(thinking.errors.empty());
  CHECK(thinking.config["data"]["enable_thinking"] == false);
  CHECK(thinking.config["data"]["enable_thinking_key"] == "think");
  const VerlConversion kwargs =
      ConvertSft({"+data.apply_chat_template_kwargs.enable_thinking=false"});
  CHECK(kwargs.errors.empty());
  CHECK(kwargs.config["data"]["enable_thinking"] == false);
  CHECK_FALSE(ConvertSft({}).config["data"].contains("enable_thinking"));
  const VerlConversion grpo =
      Convert(kVerlGrpo, {"+data.apply_chat_template_kwargs.enable_thinking=false"});
  CHECK(grpo.errors.empty());
  CHECK(grpo.config["data"]["enable_thinking"] == false);
  // The old trainer's global micro-batch, and a switch that is not one.
  CHECK(Contains(ConvertSft({"data.micro_batch_size=8"}).errors,
                 "data.micro_batch_size: not supported (the global micro-batch size"));
  CHECK(Contains(ConvertSft({"data.multiturn.enable=maybe"}).errors,
                 "data.multiturn.enable: not supported ('maybe': true or false)"));
  // A deprecated name verl still reads is read too.
  const VerlConversion clip = ConvertSft({"+optim.grad_clip=0.5"});
  CHECK(clip.config["roles"]["actor"]["train"]["grad_clip"] == 0.5);
  // Validation: by the loss on the conversations (an SFT job without a reward validates so),
  // every test_freq steps and after the last, never before the first, as verl's SFT trainer.
  const VerlConversion listed =
      ConvertSft({"data.val_files=/data/test.parquet", "trainer.test_freq=10",
                  "data.pad_mode=right", "actor_rollout_ref.rollout.n=4"});
  CHECK(listed.errors.empty());
  CHECK(Contains(listed.warnings, "data.pad_mode: ignored (micro-batches are packed by rlhfd)"));
  CHECK(Contains(listed.warnings,
                 "actor_rollout_ref.rollout.n: ignored (not a key of verl 0.9's "
                 "SFT trainer config)"));
  CHECK_FALSE(Contains(listed.warnings, "val_files"));
  CHECK_FALSE(Contains(listed.warnings, "test_freq"));
  const v1::JobSpec validated = Validated(listed);
  CHECK(validated.data().val_files_size() == 1);
  CHECK(validated.trainer().val_every() == 10);
  CHECK_FALSE(validated.trainer().val_before_train());
  CHECK(ConvertSft({}).config["trainer"].count("val_before_train") == 0);
}

}  // namespace

TEST_CASE("verl GRPO with a KL loss converts and validates", "[verl]") {
  const VerlConversion converted = Convert(kVerlGrpo);
  const v1::JobSpec spec = Validated(converted);
  CHECK(spec.name() == "qwen2.5_0.5b_function_rm");
  CHECK(spec.algorithm().adv_estimator() == v1::ADVANTAGE_ESTIMATOR_GRPO);
  CHECK(spec.algorithm().kl().mode() == v1::KL_MODE_LOSS);
  CHECK(spec.algorithm().kl().coef() == Approx(0.001));
  CHECK(spec.algorithm().kl().estimator() == v1::KL_ESTIMATOR_K3);  // low_var_kl
  CHECK(spec.roles().has_reference());
  CHECK(spec.roles().reference().log_prob_micro_batch_size_per_gpu() == 8);
  CHECK(spec.roles().reference().param_offload());
  CHECK_FALSE(spec.roles().has_critic());
  CHECK(spec.placement() == v1::PLACEMENT_COLOCATED);  // verl's hybrid engine
  CHECK(spec.roles().actor().gpus() == 2);             // n_gpus_per_node x nnodes
  CHECK(spec.roles().actor().train().dp() == 2);
  CHECK(spec.roles().actor().train().ppo_mini_batch_size() == 16);
  CHECK(spec.roles().actor().train().gradient_checkpointing());
  CHECK(spec.roles().actor().rollout().n() == 4);
  CHECK(spec.roles().actor().rollout().gpu_memory_utilization() == Approx(0.6));
  CHECK(spec.data().filter_overlong_prompts());
  CHECK(spec.data().max_response_length() == 1024);
  CHECK(spec.roles().reward().rule() == "auto");
  CHECK(spec.trainer().save_every() == 20);
  CHECK(spec.trainer().checkpoint_dir() ==
        "checkpoints/verl_grpo_example_gsm8k/qwen2.5_0.5b_function_rm");  // verl's default
  CHECK(spec.trainer().val_every() == 5);
  CHECK(spec.trainer().total_epochs() == 15);
  CHECK(spec.trainer().project_name() == "verl_grpo_example_gsm8k");
  CHECK(spec.trainer().loggers_size() == 1);  // wandb left out, with a warning
  CHECK(Contains(converted.warnings, "trainer.logger: ignored ('wandb'"));
  CHECK(Contains(converted.warnings, "actor_rollout_ref.rollout.name: ignored ('vllm'"));
  CHECK(Contains(converted.mapped, "actor_rollout_ref.actor.kl_loss_coef -> algorithm.kl.coef"));
}

TEST_CASE("verl PPO with a critic and the KL in the reward converts and validates", "[verl]") {
  const VerlConversion converted = Convert(R"(
data: {train_files: /data/train.jsonl, train_batch_size: 32}
actor_rollout_ref:
  model: {path: /models/actor}
  actor:
    optim: {lr: 1e-6, lr_warmup_steps_ratio: 0.1, warmup_style: cosine}
    ppo_mini_batch_size: 8
    ppo_micro_batch_size_per_gpu: 2
    clip_ratio: 0.25
  rollout: {n: 1, temperature: 0.9}
critic:
  model: {path: /models/critic, enable_gradient_checkpointing: False}
  optim: {lr: 1e-5, betas: [0.9, 0.95]}
  ppo_micro_batch_size_per_gpu: 2
  ppo_mini_batch_size: 8
  cliprange_value: 0.3
algorithm:
  adv_estimator: gae
  gamma: 0.99
  lam: 0.95
  use_kl_in_reward: True
  kl_penalty: kl
  kl_ctrl: {type: adaptive, kl_coef: 0.02, target_kl: 0.05, horizon: 5000}
trainer: {n_gpus_per_node: 4, total_training_steps: 100, resume_mode: disable, logger: console}
)");
  const v1::JobSpec spec = Validated(converted);
  CHECK(spec.algorithm().adv_estimator() == v1::ADVANTAGE_ESTIMATOR_GAE);
  CHECK(spec.algorithm().gamma() == Approx(0.99));
  CHECK(spec.algorithm().kl().mode() == v1::KL_MODE_IN_REWARD);
  CHECK(spec.algorithm().kl().estimator() == v1::KL_ESTIMATOR_K1);
  CHECK(spec.algorithm().kl().controller() == v1::KL_CONTROLLER_ADAPTIVE);
  CHECK(spec.algorithm().kl().coef() == Approx(0.02));
  CHECK(spec.algorithm().kl().target() == Approx(0.05));
  CHECK(spec.algorithm().kl().horizon() == 5000);
  // verl's loss takes clip_ratio_low / _high (0.2 by default) and clip_ratio only where one is
  // null: clip_ratio alone changes nothing in verl, and the conversion says so.
  CHECK(spec.algorithm().clip_ratio_low() == Approx(0.2));
  CHECK(spec.algorithm().clip_ratio_high() == Approx(0.2));
  CHECK(Contains(converted.warnings,
                 "actor_rollout_ref.actor.clip_ratio: ignored (verl uses "
                 "actor_rollout_ref.actor.clip_ratio_low (0.2) over it)"));
  REQUIRE(spec.roles().has_critic());
  CHECK(spec.roles().critic().model_path() == "/models/critic");
  CHECK(spec.roles().critic().train().lr() == Approx(1e-5));
  CHECK(spec.roles().critic().train().adam_beta2() == Approx(0.95));
  CHECK(spec.roles().critic().train().cliprange_value() == Approx(0.3));
  CHECK(spec.roles().critic().gpus() == 4);  // colocated with the actor
  CHECK(spec.roles().actor().train().lr_schedule() == v1::LR_SCHEDULE_COSINE);
  CHECK(spec.roles().actor().train().lr_warmup_steps() == 10);  // 0.1 x 100 steps
  CHECK(spec.trainer().total_steps() == 100);
  CHECK_FALSE(spec.trainer().resume());
}

// verl's critic.yaml: ppo_mini_batch_size, use_dynamic_bsz and ppo_epochs are
// ${oc.select:actor_rollout_ref.actor.<key>,...}. verl's PPO quickstart sets only the actor's
// mini-batch (64 of 256 prompts): its critic makes 4 updates a step, and so must the converted one.
TEST_CASE("verl's critic inherits the actor's mini-batch, dynamic batching and epochs", "[verl]") {
  const std::string quickstart = R"(
data: {train_files: /data/train.jsonl, train_batch_size: 256}
actor_rollout_ref:
  model: {path: /models/actor}
  actor: {ppo_mini_batch_size: 64, ppo_micro_batch_size_per_gpu: 4, use_dynamic_bsz: true,
          ppo_epochs: 2}
critic:
  model: {path: /models/critic}
  ppo_micro_batch_size_per_gpu: 4
algorithm: {adv_estimator: gae}
)";
  const VerlConversion converted = Convert(quickstart);
  const v1::JobSpec spec = Validated(converted);
  REQUIRE(spec.roles().has_critic());
  CHECK(spec.roles().critic().train().ppo_mini_batch_size() == 64);
  CHECK(spec.roles().critic().train().use_dynamic_bsz());
  CHECK(spec.roles().critic().train().ppo_epochs() == 2);
  CHECK(Contains(converted.mapped,
                 "critic.ppo_mini_batch_size -> roles.critic.train.ppo_mini_batch_size"));
  // The critic's own keys win, as in verl; an interpolation is resolved as OmegaConf resolves it
  // (x does not exist: oc.select's default, 1).
  const VerlConversion own =
      Convert(quickstart, {"critic.ppo_mini_batch_size=32", "critic.ppo_epochs=${oc.select:x,1}"});
  const v1::JobSpec own_spec = Validated(own);
  CHECK(own_spec.roles().critic().train().ppo_mini_batch_size() == 32);
  CHECK(own_spec.roles().critic().train().ppo_epochs() == 1);
  // No critic (GRPO): nothing is inherited.
  const v1::JobSpec grpo = Validated(
      Convert(quickstart, {"algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"}));
  CHECK_FALSE(grpo.roles().has_critic());
}

TEST_CASE("verl's critic-free estimators convert and validate without a critic", "[verl]") {
  for (const std::string estimator : {"rloo", "remax", "grpo_passk", "opo"}) {
    INFO(estimator);
    const v1::JobSpec spec = Validated(Convert(
        R"(
data: {train_batch_size: 16}
actor_rollout_ref:
  actor: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 8}
  rollout: {n: 4}
trainer: {n_gpus_per_node: 1}
)",
        {"algorithm.adv_estimator=" + estimator}));
    CHECK(config::EnumConfigName(*v1::AdvantageEstimator_descriptor()->FindValueByNumber(
              spec.algorithm().adv_estimator())) == estimator);
    CHECK_FALSE(spec.roles().has_critic());
    CHECK(spec.algorithm().kl().mode() == v1::KL_MODE_NONE);  // verl's switches default off
  }
}

TEST_CASE("every directly mapped verl key lands in its field", "[verl]") {
  // One distinct value per key, typed by the target field: a string, a number, a switch, or
  // one of the enum's names.
  int counter = 0;
  std::vector<std::string> overrides;
  std::map<std::string, nlohmann::json> expected;  // rlhfd path → value
  for (const auto& [verl, ours] : VerlDirectMappings()) {
    const Descriptor* schema = v1::JobSpec::descriptor();
    const FieldDescriptor* field = nullptr;
    for (const std::string& part : std::vector<std::string>(absl::StrSplit(ours, '.'))) {
      REQUIRE(schema != nullptr);
      field = schema->FindFieldByName(part);
      INFO(ours << ": no field " << part);
      REQUIRE(field != nullptr);
      schema =
          field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ? field->message_type() : nullptr;
    }
    ++counter;
    nlohmann::json value;
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        value = absl::StrCat("/value/", counter);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        value = true;
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        value = EnumConfigName(*field->enum_type()->value(field->enum_type()->value_count() - 1));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        value = 0.5 + counter;
        break;
      default:
        value = 1000 + counter;
    }
    if (field->is_repeated()) value = nlohmann::json::array({value});
    overrides.push_back(
        absl::StrCat(verl, "=", value.is_string() ? value.get<std::string>() : value.dump()));
    expected[ours] = value;
  }
  // The critic's keys are mapped when there is a critic (gae), the reference's with a KL.
  overrides.push_back("algorithm.adv_estimator=gae");
  expected["algorithm.adv_estimator"] = "gae";
  overrides.push_back("actor_rollout_ref.actor.use_kl_loss=true");
  const VerlConversion converted = Convert("", overrides);
  for (const auto& [path, value] : expected) {
    INFO(path);
    const nlohmann::json* landed = At(converted.config, path);
    REQUIRE(landed != nullptr);
    CHECK(*landed == value);
  }
  CHECK(VerlDirectMappings().size() >= 60);
}

TEST_CASE("verl's parquet data files are kept as they are", "[verl]") {
  const VerlConversion converted = Convert(
      kVerlGrpo,
      {"data.train_files=[~/data/gsm8k/train.parquet]", "data.val_files=/data/gsm8k/test.parquet"});
  INFO(absl::StrJoin(converted.errors, "; "));
  CHECK(converted.errors.empty());
  // The converted document (Validated() would put its own data files in).
  const nlohmann::json& data = converted.config.at("data");
  REQUIRE(data.at("train_files").size() == 1);
  const std::string train = data.at("train_files")[0].get<std::string>();
  CHECK(absl::EndsWith(train, "/data/gsm8k/train.parquet"));
  CHECK(train[0] == '/');  // ~ expanded
  CHECK(data.at("val_files").dump().find("/data/gsm8k/test.parquet") != std::string::npos);
}

TEST_CASE("verl's custom_reward_function becomes roles.reward.custom_reward_function", "[verl]") {
  // verl's top-level keys, with reward_kwargs, in place of the default rule reward.
  const VerlConversion legacy =
      Convert(kVerlGrpo, {"custom_reward_function.path=/code/reward.py",
                          "custom_reward_function.name=my_reward_fn",
                          "+custom_reward_function.reward_kwargs.scale=0.5",
                          "+custom_reward_function.reward_kwargs.style.strict=true"});
  const v1::JobSpec spec = Validated(legacy);
  CHECK(spec.roles().reward().rule().empty());
  const v1::PythonRewardSpec& function = spec.roles().reward().custom_reward_function();
  CHECK(function.path() == "/code/reward.py");
  CHECK(function.name() == "my_reward_fn");
  CHECK(function.reward_kwargs().fields().at("scale").number_value() == 0.5);
  CHECK(function.reward_kwargs()
            .fields()
            .at("style")
            .struct_value()
            .fields()
            .at("strict")
            .bool_value());
  CHECK(Contains(legacy.mapped,
                 "custom_reward_function.path -> roles.reward.custom_reward_function.path"));
  // verl's newer layout (under reward:), the name left at verl's default; ~ expanded here.
  const VerlConversion newer =
      Convert(kVerlGrpo, {"+reward.custom_reward_function.path=~/rewards/reward.py",
                          "+reward.custom_reward_function.name=compute_score"});
  const v1::JobSpec newer_spec = Validated(newer);
  const std::string path = newer_spec.roles().reward().custom_reward_function().path();
  CHECK(path[0] == '/');
  CHECK(absl::EndsWith(path, "/rewards/reward.py"));
  CHECK(newer_spec.roles().reward().custom_reward_function().name() == "compute_score");
  // verl's defaults (no path, a name): its default reward, the rule picked by data_source.
  const v1::JobSpec unset =
      Validated(Convert(kVerlGrpo, {"+reward.custom_reward_function.name=compute_score",
                                    "+custom_reward_function.path=null"}));
  CHECK(unset.roles().reward().rule() == "auto");
  CHECK_FALSE(unset.roles().reward().has_custom_reward_function());
  // With a reward model verl would leave the function unused: refused.
  const VerlConversion both =
      Convert("", {"custom_reward_function.path=/code/reward.py", "reward_model.enable=true",
                   "reward_model.model.path=/models/rm"});
  CHECK(Contains(both.errors, "custom_reward_function.path: not supported"));
  CHECK(Contains(both.errors, "keep one of them"));
}

TEST_CASE("verl's multi_turn keys land in roles.actor.rollout.multi_turn", "[verl]") {
  const v1::JobSpec spec = Validated(
      Convert(kVerlGrpo, {"actor_rollout_ref.rollout.multi_turn.enable=true",
                          "actor_rollout_ref.rollout.multi_turn.tool_config_path=/cfg/tools.yaml",
                          "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
                          "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
                          "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left",
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=1"}));
  const v1::MultiTurnSpec& turns = spec.roles().actor().rollout().multi_turn();
  CHECK(turns.enable());
  CHECK(turns.tool_config_path() == "/cfg/tools.yaml");
  CHECK(turns.format() == "hermes");
  CHECK(turns.max_assistant_turns() == 5);
  CHECK(turns.max_user_turns() == 0);  // verl's null
  CHECK(turns.max_parallel_calls() == 2);
  CHECK(turns.max_tool_response_length() == 256);
  CHECK(turns.tool_response_truncate_side() == "left");
}

// verl's standalone rollout (rollout.nnodes > 0): GPUs of its own, a rollout pool here; at verl's
// default (nnodes 0) the hybrid engine, no pool.
TEST_CASE("verl's rollout.nnodes x n_gpus_per_node becomes roles.rollout.gpus", "[verl]") {
  const v1::JobSpec pool = Validated(
      Convert(kVerlGrpo, {"actor_rollout_ref.rollout.nnodes=1",
                          "actor_rollout_ref.rollout.n_gpus_per_node=2",
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=2"}));
  CHECK(pool.roles().has_rollout());
  CHECK(pool.roles().rollout().gpus() == 2);
  CHECK(pool.roles().actor().rollout().tp() == 2);
  const v1::JobSpec hybrid = Validated(Convert(kVerlGrpo, {"actor_rollout_ref.rollout.nnodes=0"}));
  CHECK_FALSE(hybrid.roles().has_rollout());
}

TEST_CASE("verl's actor checkpoint.async_save maps to trainer.async_save", "[verl]") {
  const VerlConversion converted =
      Convert("", {"actor_rollout_ref.actor.checkpoint.async_save=true",
                   "trainer.default_local_dir=/tmp/checkpoints"});
  INFO(absl::StrJoin(converted.errors, "\n"));
  CHECK(converted.errors.empty());
  CHECK(converted.config["trainer"]["async_save"] == true);
}

TEST_CASE("verl's LoRA keys map to model.lora_*; target_modules becomes a list", "[verl]") {
  const char* home = std::getenv("HOME");
  const VerlConversion converted =
      Convert("", {"actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32",
                   "actor_rollout_ref.model.lora_adapter_path=~/adapters/a"});
  INFO(absl::StrJoin(converted.errors, "\n"));
  CHECK(converted.errors.empty());
  const nlohmann::json& model = converted.config["model"];
  CHECK(model["lora_rank"] == 16);
  CHECK(model["lora_alpha"] == 32);
  CHECK(model["target_modules"] == nlohmann::json::array({"all-linear"}));  // verl's string
  CHECK(model["lora_adapter_path"] == std::string(home != nullptr ? home : "~") + "/adapters/a");
  const VerlConversion listed =
      Convert("", {"actor_rollout_ref.model.lora_rank=8",
                   "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"});
  CHECK(listed.config["model"]["target_modules"] == nlohmann::json::array({"q_proj", "v_proj"}));
  // A LoRA critic is refused, naming it.
  const VerlConversion critic = Convert("", {"critic.model.lora_rank=8"});
  CHECK(Contains(critic.errors, "critic.model.lora_rank: not supported (LoRA critics"));
}

TEST_CASE("verl's policy losses map to algorithm.policy_loss", "[verl]") {
  for (const std::string mode : {"vanilla", "gspo", "sapo", "cispo", "gpg", "geo_mean", "clip_cov",
                                 "kl_cov", "dppo_tv", "dppo_kl", "dro"}) {
    INFO(mode);
    const VerlConversion converted =
        Convert("", {"actor_rollout_ref.actor.policy_loss.loss_mode=" + mode,
                     "actor_rollout_ref.actor.tau_pos=1.5", "actor_rollout_ref.actor.tau_neg=2.5",
                     "actor_rollout_ref.actor.policy_loss.dro_beta=0.5"});
    CHECK(converted.errors.empty());
    CHECK(converted.config["algorithm"]["policy_loss"] == mode);
    CHECK(converted.config["algorithm"]["tau_pos"] == 1.5);
    CHECK(converted.config["algorithm"]["tau_neg"] == 2.5);
    CHECK(converted.config["algorithm"]["dro_beta"] == 0.5);
  }
  // verl's defaults: vanilla, tau 1.0 and 1.05 (update_options_test parses such a job), and
  // the covariance losses' parameters of its PolicyLossConfig.
  const nlohmann::json defaults = Convert("", {}).config["algorithm"];
  CHECK(defaults["policy_loss"] == "vanilla");
  CHECK(defaults["tau_pos"] == 1.0);
  CHECK(defaults["tau_neg"] == 1.05);
  CHECK(defaults["clip_cov_ratio"] == 0.0002);
  CHECK(defaults["clip_cov_lb"] == 1.0);
  CHECK(defaults["clip_cov_ub"] == 5.0);
  CHECK(defaults["kl_cov_ratio"] == 0.0002);
  CHECK(defaults["ppo_kl_coef"] == 0.1);
  const nlohmann::json set = Convert("", {"actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
                                          "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.01",
                                          "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=1.0",
                                          "actor_rollout_ref.actor.policy_loss.clip_cov_lb=-1",
                                          "actor_rollout_ref.actor.policy_loss.clip_cov_ub=2",
                                          "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.5"})
                                 .config["algorithm"];
  CHECK(set["kl_cov_ratio"] == 0.01);
  CHECK(set["ppo_kl_coef"] == 1.0);
  CHECK(set["clip_cov_lb"] == -1);
  CHECK(set["clip_cov_ub"] == 2);
  CHECK(set["clip_cov_ratio"] == 0.5);
}

TEST_CASE("every verl setting rlhfd cannot honour is named, with why", "[verl]") {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"actor_rollout_ref.model.exclude_modules=[o_proj]", "name the layers in target_modules"},
      {"actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "sequence parallelism"},
      {"actor_rollout_ref.actor.policy_loss.loss_mode=my_loss",
       "'my_loss': rlhfd computes the policy losses vanilla, gspo, sapo, cispo, gpg, geo_mean, "
       "clip_cov, kl_cov, dppo_tv, dppo_kl, dro"},
      {"actor_rollout_ref.rollout.multi_turn.function_tool_path=/code/tools.py",
       "Python function tools"},
      {"actor_rollout_ref.actor.strategy=megatron", "Megatron"},
      {"algorithm.use_pf_ppo=true", "PF-PPO"},
      {"actor_rollout_ref.model.custom_chat_template=my_template", "model.chat_template"},
      {"actor_rollout_ref.actor.kl_loss_type=full", "estimators are kl"},
      {"trainer.resume_mode=resume_path", "resumes from the latest checkpoint"},
  };
  for (const auto& [override_text, reason] : refused) {
    INFO(override_text);
    std::vector<std::string> overrides = {override_text};
    if (override_text.find("kl_loss_type") != std::string::npos) {
      overrides.push_back("actor_rollout_ref.actor.use_kl_loss=true");
    }
    const VerlConversion converted = Convert("", overrides);
    const std::string key = override_text.substr(0, override_text.find('='));
    CHECK(Contains(converted.errors, key + ": not supported"));
    CHECK(Contains(converted.errors, reason));
  }
  // Both KL switches at once: rlhfd applies the KL one way.
  const VerlConversion both =
      Convert("", {"actor_rollout_ref.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=true"});
  CHECK(Contains(both.errors, "algorithm.use_kl_in_reward: not supported"));
  // Settings left at verl's defaults are not reported, whatever their key; only the default of
  // verl's that rlhfd cannot honour is: wandb. Its tensor-parallel rollout (2) on its 8 GPUs is
  // kept; on one GPU it becomes 1, said so.
  const VerlConversion quiet = Convert(
      "", {"actor_rollout_ref.model.lora_rank=0",
           "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
           "reward_model.reward_manager=naive", "actor_rollout_ref.actor.profiler.enable=false"});
  CHECK(quiet.errors.empty());
  std::vector<std::string> quiet_keys;
  for (const VerlNote& note : quiet.notes) quiet_keys.push_back(note.key);
  CHECK(quiet_keys == std::vector<std::string>{"trainer.logger"});
  CHECK(quiet.config["roles"]["actor"]["rollout"]["tp"] == 2);
  const VerlConversion one_gpu = Convert("", {"trainer.n_gpus_per_node=1"});
  CHECK(one_gpu.config["roles"]["actor"]["rollout"]["tp"] == 1);
  CHECK(Contains(one_gpu.warnings,
                 "actor_rollout_ref.rollout.tensor_model_parallel_size: ignored "
                 "(verl's default 2 does not divide the job's 1 GPU;"));
  // Set by the script to another value, it is kept for the validator to judge.
  const VerlConversion set = Convert(
      "", {"trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=4"});
  CHECK(set.config["roles"]["actor"]["rollout"]["tp"] == 4);
  // Reference settings without a KL: verl loads no reference, and neither does rlhfd.
  const VerlConversion no_kl =
      Convert("", {"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"});
  CHECK_FALSE(no_kl.config["roles"].contains("reference"));
  CHECK(Contains(no_kl.warnings, "actor_rollout_ref.ref: ignored (no KL is used"));
  // A key rlhfd does not know is named as ignored.
  const VerlConversion unknown = Convert("", {"trainer.some_new_verl_knob=3"});
  CHECK(Contains(unknown.warnings,
                 "trainer.some_new_verl_knob: ignored (not a key of verl 0.9's config)"));
}

// docs/coming-from-verl.md gives each key's fate from the tables; a key the converter's code reads
// must be in one of them, so that the page says what becomes of it.
TEST_CASE("every verl key the converter reads has its fate in the key tables", "[verl]") {
  std::set<std::string> tabled;
  for (const auto& [from, to] : verl_keys::DirectTable()) tabled.insert(from);
  for (const auto* table :
       {&verl_keys::DerivedTable(), &verl_keys::HarmlessTable(), &verl_keys::UnsupportedTable()}) {
    for (const auto& [key, why] : *table) tabled.insert(key);
  }
  for (const std::vector<std::string>& overrides :
       {std::vector<std::string>{},
        {"actor_rollout_ref.actor.use_kl_loss=true"},
        {"algorithm.use_kl_in_reward=true", "reward_model.enable=true"},
        {"algorithm.adv_estimator=grpo"}}) {
    const VerlConversion converted = Convert("", overrides);
    CHECK(converted.read.size() > 80);
    for (const std::string& key : converted.read) {
      INFO(key);
      CHECK(tabled.count(key) == 1);
    }
  }
}

// OmegaConf's forms, as verl's configs use them, resolved in a verl YAML and in overrides; what
// cannot be resolved is refused naming the key, and nothing ${...} reaches the output.
TEST_CASE("verl interpolations resolve as OmegaConf resolves them", "[verl]") {
  ::setenv("RLHFD_VERL_TEST_LR", "3e-6", 1);
  const VerlConversion converted = Convert(R"(
data: {train_batch_size: 64, max_response_length: 256}
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: ${oc.select:data.train_batch_size,8}
    ppo_epochs: ${oc.select:actor_rollout_ref.actor.no_such_key,3}
    optim:
      lr: ${oc.env:RLHFD_VERL_TEST_LR,1e-6}
      weight_decay: ${oc.env:RLHFD_NO_SUCH_VAR,0.05}
  rollout:
    n: ${..actor.ppo_epochs}
trainer:
  project_name: p
  experiment_name: e-${data.max_response_length}
)");
  const Json& train = converted.config["roles"]["actor"]["train"];
  CHECK(train["ppo_mini_batch_size"] == 64);  // typed: the node's value, not text
  CHECK(train["ppo_epochs"] == 3);            // oc.select's default for a missing key
  // oc.env gives text, as OmegaConf's does; read as a number, as verl's float fields take it.
  CHECK(train["lr"] == 3e-6);
  CHECK(train["weight_decay"] == 0.05);
  CHECK(converted.config["roles"]["actor"]["rollout"]["n"] == 3);  // relative, two levels up
  CHECK(converted.config["name"] == "e-256");                      // embedded in text
  CHECK(converted.config["trainer"]["checkpoint_dir"] == "checkpoints/p/e-256");  // verl's own
  CHECK(converted.errors.empty());

  const VerlConversion missing =
      Convert("", {"trainer.project_name=${trainer.no_such_key}",
                   "actor_rollout_ref.actor.ppo_epochs=${oc.decode:'2'}",
                   "actor_rollout_ref.rollout.n=${actor_rollout_ref.rollout.n}"});
  CHECK(Contains(missing.errors,
                 "trainer.project_name: not supported ('${trainer.no_such_key}' "
                 "cannot be resolved: `trainer.no_such_key` is not a key"));
  CHECK(Contains(missing.errors, "actor_rollout_ref.actor.ppo_epochs: not supported"));
  CHECK(Contains(missing.errors, "the resolver 'oc.decode' is not one verl's configs use"));
  CHECK(Contains(missing.errors, "actor_rollout_ref.rollout.n: not supported"));
  CHECK(Contains(missing.errors, "refers to itself"));
  CHECK(missing.config.dump().find("${") == std::string::npos);

  // Hostile nesting and repetition end in an error, not a crash or an exhausted memory:
  // 10,000 nested ${ and keys that each repeat the one before twice.
  std::string nested;
  for (int i = 0; i < 10000; ++i) nested += "${";
  nested += "trainer.project_name";
  for (int i = 0; i < 10000; ++i) nested += "}";
  const VerlConversion deep = Convert("", {"trainer.experiment_name=" + nested});
  CHECK(Contains(deep.errors, "nest too deeply"));
  std::string doubling = "trainer:\n  k00: ab\n";
  for (int i = 1; i <= 40; ++i) {
    doubling += absl::StrCat("  k", i < 10 ? "0" : "", i, ": ${trainer.k", i <= 10 ? "0" : "",
                             i - 1, "}${trainer.k", i <= 10 ? "0" : "", i - 1, "}\n");
  }
  doubling += "  experiment_name: ${trainer.k25}\n";  // 2^26 bytes, 26 deep
  const VerlConversion repeated = Convert(doubling, {});
  CHECK(Contains(repeated.errors, "MiB of text"));

  // An rlhfd config holds values: `validate` refuses a ${...} copied into one, naming the key.
  auto literal = LoadConfig("trainer: {project_name: '${trainer.experiment_name}'}\n", "job.yaml",
                            {"model.path=/models/m", "data.train_files=[/data/train.jsonl]"});
  REQUIRE_FALSE(literal.ok());
  CHECK_THAT(std::string(literal.status().message()),
             Catch::Contains("trainer.project_name: '${trainer.experiment_name}' is an "
                             "interpolation"));
}

// What a script's overrides and a verl YAML can say that must not be misread or exhaust the
// submitting (or the controller's) process: each is refused naming what to fix.
TEST_CASE("verl input that would be misread, or cost without bound, is refused by name", "[verl]") {
  const auto refused = [](const std::string& text, const std::vector<std::string>& overrides) {
    auto converted = ConvertVerlConfig(text, "verl.yaml", overrides, VerlTrainer::kPpo);
    REQUIRE_FALSE(converted.ok());
    return std::string(converted.status().message());
  };
  // An override whose key nests 40 levels (one of 64 KiB could nest 32,767).
  std::string deep_key = "a";
  for (int i = 0; i < 40; ++i) deep_key += ".a";
  CHECK_THAT(refused("", {deep_key + "=1"}), Catch::Contains("the key has more than 32 parts"));
  // Nothing after '=' (an unset shell variable) would have meant verl's default.
  CHECK_THAT(refused("", {"data.train_batch_size="}),
             Catch::Contains("no value after '='") && Catch::Contains("key=null"));
  // ~ removes the key named, or says it is not there; ~key=value only where it holds value.
  CHECK_THAT(refused("", {"~actor_rollout_ref.actor.optim.foo.lr"}),
             Catch::Contains("there is no key 'actor_rollout_ref.actor.optim.foo' to remove"));
  CHECK_THAT(refused("", {"~trainer.nnodes=2"}), Catch::Contains("the key holds 1"));
  CHECK(Convert("", {"~trainer.nnodes=1"}).errors.empty());
  // Compared typed, as Hydra compares: True is verl's true, 1e-6 its 1e-06.
  CHECK(Convert("", {"trainer.val_before_train=true", "~trainer.val_before_train=True",
                     "actor_rollout_ref.actor.optim.lr=1e-06",
                     "~actor_rollout_ref.actor.optim.lr=1e-6"})
            .errors.empty());
  // Hydra's composition from another config, and YAML merge keys, would drop what they bring.
  CHECK_THAT(refused("defaults: [my_base, _self_]\n", {}),
             Catch::Contains("defaults: 'my_base' composes another config"));
  CHECK_THAT(refused("defaults: [ppo_megatron_trainer, _self_]\n", {}),
             Catch::Contains("Megatron's parts"));
  CHECK(Convert("defaults: [ppo_trainer, _self_]\n").errors.empty());
  // verl's own list's choices of its parts (a copy of ppo_trainer.yaml's head), and the SFT
  // trainer's config by its verl 0.9 name.
  CHECK(Convert("defaults:\n  - model_engine: dp\n  - actor@actor_rollout_ref.actor: dp_actor\n"
                "  - data@data: legacy_data\n  - _self_\n")
            .errors.empty());
  CHECK_THAT(refused("defaults:\n  - actor@actor_rollout_ref.actor: megatron_actor\n", {}),
             Catch::Contains("Megatron's parts"));
  CHECK(ConvertVerlConfig("defaults: [sft_trainer_engine, _self_]\n", "sft.yaml", {},
                          VerlTrainer::kSft)
            .ok());
  CHECK_THAT(refused("o: &o {lr: 3e-6}\nactor_rollout_ref: {actor: {optim: {<<: *o}}}\n", {}),
             Catch::Contains("merge keys (<<: *anchor) are not supported"));
  // Interpolations chained through 100 mappings, and 2,000 references to a list of 1,000
  // items: an error naming a key, not a stack overflow or 2 million copied values.
  std::string chain = "trainer:\n";
  for (int i = 0; i < 100; ++i)
    chain += absl::StrCat("  a", i, ": {x: '${trainer.a", i + 1, "}'}\n");
  chain += "  a100: {x: 1}\n  experiment_name: '${trainer.a0}'\n";
  const VerlConversion chained = Convert(chain);
  INFO(absl::StrJoin(chained.errors, "\n") << absl::StrJoin(chained.warnings, "\n"));
  CHECK(Contains(chained.errors, "interpolations in a row"));
  std::string copies = "trainer:\n  b: [";
  for (int i = 0; i < 1000; ++i) copies += "x, ";
  copies += "x]\n  r: [";
  for (int i = 0; i < 2000; ++i) copies += "'${trainer.b}', ";
  copies += "'${trainer.b}']\n  experiment_name: '${trainer.r}'\n";
  const VerlConversion copied = Convert(copies);
  INFO(absl::StrJoin(copied.errors, "\n") << absl::StrJoin(copied.warnings, "\n"));
  CHECK(Contains(copied.errors, "interpolations copy more than 1000000 values"));
  // The switches the conversion reads itself: not true or false is an error, not "off".
  CHECK(Contains(Convert("", {"actor_rollout_ref.actor.use_kl_loss=yes"}).errors,
                 "actor_rollout_ref.actor.use_kl_loss: not supported ('yes': expected true or "
                 "false)"));
  CHECK(Contains(Convert("", {"reward_model.enable=1"}).errors, "reward_model.enable"));
  // DAPO's overlong penalty shapes the reward, batch calls with lists: refused in both of
  // verl's spellings; naive, prime and dapo without the penalty score each row by itself.
  CHECK(Contains(Convert("", {"reward_model.reward_manager=batch"}).errors,
                 "reward_model.reward_manager: not supported ('batch'"));
  CHECK(Contains(Convert("", {"reward.reward_manager.name=batch"}).errors,
                 "reward.reward_manager.name: not supported ('batch'"));
  for (const std::string prefix : {"reward_model", "reward"}) {
    CHECK(Contains(
        Convert("", {"+" + prefix + ".reward_kwargs.overlong_buffer_cfg.enable=True"}).errors,
        prefix + ".reward_kwargs.overlong_buffer_cfg.enable: not supported"));
  }
  for (const std::string manager : {"naive", "prime", "dapo"}) {
    CHECK(Convert("", {"reward_model.reward_manager=" + manager,
                       "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=False"})
              .errors.empty());
  }
  // Counts past what a cluster has, or not whole, are refused naming verl's key.
  CHECK(Contains(Convert("", {"trainer.n_gpus_per_node=1e300"}).errors,
                 "trainer.n_gpus_per_node: not supported ('1e+300': expected a whole number"));
  CHECK(Contains(Convert("", {"trainer.nnodes=2.5"}).errors, "trainer.nnodes: not supported"));
}

// verl keeps max_actor_ckpt_to_keep actor and max_critic_ckpt_to_keep critic checkpoints; an
// rlhfd step directory holds both, so the larger count is kept. null or <= 0 keeps all.
TEST_CASE("verl's max_*_ckpt_to_keep become trainer.max_ckpt_to_keep", "[verl]") {
  const auto keep = [](const std::vector<std::string>& overrides) {
    const VerlConversion converted = Convert(kVerlGrpo, overrides);
    CHECK(converted.warnings.end() ==
          std::find_if(converted.warnings.begin(), converted.warnings.end(), [](const auto& line) {
            return line.find("ckpt_to_keep") != std::string::npos;
          }));
    return Validated(converted).trainer().max_ckpt_to_keep();
  };
  CHECK(keep({}) == 0);
  CHECK(keep({"trainer.max_actor_ckpt_to_keep=null"}) == 0);
  CHECK(keep({"trainer.max_actor_ckpt_to_keep=3"}) == 3);
  CHECK(keep({"trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=4"}) == 4);
  CHECK(keep({"trainer.max_actor_ckpt_to_keep=-1"}) == 0);
  const VerlConversion converted = Convert(kVerlGrpo, {"trainer.max_critic_ckpt_to_keep=5"});
  CHECK(Contains(converted.mapped, "trainer.max_critic_ckpt_to_keep -> trainer.max_ckpt_to_keep"));
  const VerlConversion wrong = Convert(kVerlGrpo, {"trainer.max_actor_ckpt_to_keep=many"});
  CHECK(Contains(wrong.errors, "trainer.max_actor_ckpt_to_keep: not supported ('many'"));
}

TEST_CASE("verl's log_val_generations becomes trainer.log_samples", "[verl]") {
  const VerlConversion converted = Convert(kVerlGrpo, {"trainer.log_val_generations=10"});
  CHECK(Contains(converted.mapped, "trainer.log_val_generations -> trainer.log_samples"));
  CHECK(Validated(converted).trainer().log_samples() == 10);
  CHECK(Validated(Convert(kVerlGrpo, {})).trainer().log_samples() == 4);
  // Past the bound: the validator names the key.
  const VerlConversion many = Convert(kVerlGrpo, {"trainer.log_val_generations=1000"});
  const auto refused = LoadConfig(many.config.dump(), "verl.json",
                                  {"model.path=/models/m", "data.train_files=[/data/train.jsonl]"});
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("trainer.log_samples"));
}

TEST_CASE("Hydra overrides apply to verl configs and to rlhfd configs", "[verl][overrides]") {
  // verl: overrides win over the file, ~ removes, + adds.
  const VerlConversion converted =
      Convert(kVerlGrpo, {"data.train_batch_size=128", "~trainer.logger",
                          "+actor_rollout_ref.rollout.top_k=50",
                          "++actor_rollout_ref.rollout.temperature=0.8"});
  const v1::JobSpec spec = Validated(converted);
  CHECK(spec.data().train_batch_size() == 128);
  CHECK(spec.trainer().loggers_size() == 1);  // rlhfd's default: console
  CHECK(spec.roles().actor().rollout().top_k() == 50);
  CHECK(spec.roles().actor().rollout().temperature() == Approx(0.8));

  // rlhfd: the same syntax over our own keys, lists and mappings as YAML.
  const std::string ours = R"(
name: overrides
model: {path: /m}
data: {train_files: [a.jsonl], train_batch_size: 16}
algorithm: {adv_estimator: grpo}
roles:
  actor: {gpus: 2, train: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 4}, rollout: {n: 4}}
  reward: {rule: gsm8k}
)";
  auto overridden = ParseJobSpec(
      ours, "job.yaml",
      {"roles.actor.rollout.n=8", "trainer.loggers=[console, jsonl]",
       "algorithm.kl={mode: loss, coef: 0.01}", "roles.reference={}", "trainer.seed=7"});
  INFO(overridden.status().ToString());
  REQUIRE(overridden.ok());
  CHECK(overridden->roles().actor().rollout().n() == 8);
  CHECK(overridden->trainer().loggers_size() == 2);
  CHECK(overridden->algorithm().kl().coef() == Approx(0.01));
  CHECK(overridden->trainer().seed() == 7);
  // Bad overrides are refused naming the override.
  for (const auto& [bad, problem] : std::vector<std::pair<std::string, std::string>>{
           {"roles.actor.rollout.n", "expected key.path=value"},
           {"roles..n=3", "empty part"},
           {"name.sub=3", "'name' holds a value"},
           {"roles.actor.rollout.n=[1, 2", "the value is not YAML"},
           {"roles.actor.rollout.nn=3",
            "roles.actor.rollout.nn: unknown key; did you mean 'n'?"}}) {
    INFO(bad);
    auto refused = ParseJobSpec(ours, "job.yaml", {bad});
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.status().message()), Catch::Contains(problem));
  }
}

TEST_CASE("validate's view: defaults and derived values are marked", "[verl][validate]") {
  const std::string yaml = R"(
name: marked
model: {path: /m}
data: {train_files: [a.jsonl], train_batch_size: 16}
algorithm: {adv_estimator: grpo, kl: {mode: in_reward}}
roles:
  actor: {gpus: 2, train: {ppo_mini_batch_size: 8}, rollout: {n: 4}}
  reference: {}
  reward: {rule: gsm8k}
)";
  auto loaded = LoadConfig(yaml, "job.yaml");
  REQUIRE(loaded.ok());
  CHECK(loaded->defaulted.count("roles.actor.train.ppo_micro_batch_size_per_gpu"));
  CHECK(loaded->defaulted.count("data.max_prompt_length"));
  CHECK_FALSE(loaded->defaulted.count("data.train_batch_size"));
  CHECK(loaded->derived.count("roles.actor.train.dp"));
  CHECK(loaded->derived.count("roles.reference.gpus"));
  CHECK(loaded->derived.count("algorithm.kl.estimator"));  // k1 for in_reward, as verl
  CHECK(loaded->spec.algorithm().kl().estimator() == v1::KL_ESTIMATOR_K1);
  CHECK(loaded->derived.count("trainer.experiment_name"));
  const std::string printed =
      ToYaml(SpecToDocument(loaded->spec), [&](const std::string& path) -> std::string {
        return loaded->defaulted.count(path) ? "(default)" : "";
      });
  CHECK_THAT(printed, Catch::Contains("  max_prompt_length: 512  # (default)\n"));
  CHECK_THAT(printed, Catch::Contains("  train_batch_size: 16\n"));
  CHECK_THAT(printed, Catch::Contains("  loss_agg_mode: token-mean  # (default)\n"));
  CHECK_THAT(printed, Catch::StartsWith("name: marked\nmodel:\n"));  // schema order
  // What validate prints reads back as the same job.
  auto again = ParseJobSpec(printed, "printed.yaml");
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  CHECK(again->SerializeAsString() == loaded->spec.SerializeAsString());
}

}  // namespace rlhfd::config

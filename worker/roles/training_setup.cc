#include "worker/roles/training_setup.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include "absl/strings/str_join.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/algorithms/on_policy.h"
#include "common/models/lora_targets.h"
#include "common/stages/role_names.h"
#include "common/status/status_macros.h"
#include "worker/roles/forward_passes.h"
#include "worker/train/distributed/fully_sharded.h"
#include "worker/train/distributed/replicated_model.h"

namespace rlhfd::roles {

std::unique_ptr<train::TrainedModel> MakeTrainedModel(model::Transformer module,
                                                      const v1::TrainSpec& train,
                                                      parallel::Communicator& pool) {
  const train::AdamWOptions adam{.beta1 = train.adam_beta1(),
                                 .beta2 = train.adam_beta2(),
                                 .eps = 1e-8,
                                 .weight_decay = train.weight_decay()};
  if (pool.size() == 1) return std::make_unique<train::LocalModel>(std::move(module), adam);
  // A LoRA model's frozen base stays whole on every rank, and ZeRO-2 shards the adapters'
  // optimiser state: ZeRO-3 would shard a base that neither trains nor changes.
  if (train.zero_stage() == 3 && !model::HasLoraAdapters(module)) {
    return std::make_unique<train::FullyShardedModel>(std::move(module), pool, adam);
  }
  return std::make_unique<train::ReplicatedModel>(std::move(module), pool, adam);
}

bool UsesLora(const v1::JobSpec& spec) {
  return spec.model().lora_rank() > 0 || !spec.model().lora_adapter_path().empty();
}

absl::StatusOr<model::LoraOptions> AddJobLoraAdapters(const v1::JobSpec& spec,
                                                      model::Transformer& module) {
  const v1::ModelSpec& model = spec.model();
  model::LoraOptions options{.rank = model.lora_rank(), .alpha = model.lora_alpha()};
  ASSIGN_OR_RETURN(options.layers,
                   models::ResolveLoraTargets(std::vector<std::string>(
                       model.target_modules().begin(), model.target_modules().end())));
  const std::string& path = model.lora_adapter_path();
  if (!path.empty()) {
    ASSIGN_OR_RETURN(const model::LoraOptions adapter, model::ReadPeftAdapterConfig(path));
    if (options.rank == 0) {
      options = adapter;
    } else if (adapter.rank != options.rank || adapter.alpha != options.alpha ||
               adapter.layers != options.layers || adapter.rslora) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.lora_adapter_path ", path, " holds rank ", adapter.rank, ", alpha ", adapter.alpha,
          (adapter.rslora ? " (rsLoRA)" : ""), " on ", absl::StrJoin(adapter.layers, ", "),
          ", but model.lora_rank is ", options.rank, ", lora_alpha ", options.alpha,
          " and target_modules ", absl::StrJoin(options.layers, ", "),
          ": set lora_rank 0 to take the adapter's"));
    }
  }
  RETURN_IF_ERROR(
      model::AddLoraAdapters(module, options, static_cast<uint64_t>(spec.trainer().seed())));
  if (!path.empty()) RETURN_IF_ERROR(model::LoadPeftAdapter(module, path));
  return options;
}

int64_t OptimizerStepsPerRlStep(const v1::JobSpec& spec, const v1::TrainSpec& train) {
  const int64_t mini_batches = spec.data().train_batch_size() / train.ppo_mini_batch_size();
  return mini_batches * train.ppo_epochs();
}

train::UpdateLoopOptions UpdateLoopOptionsOf(const v1::JobSpec& spec, v1::Role role,
                                             const v1::TrainSpec& train, int replicas,
                                             int64_t rl_step, const train::LrSchedule* schedule,
                                             int64_t first_step, int64_t nonfinite_skips) {
  const int64_t n = spec.roles().actor().rollout().n();
  train::UpdateLoopOptions loop;
  loop.mini_batch = int64_t{train.ppo_mini_batch_size()} * n / replicas;
  loop.epochs = train.ppo_epochs();
  // A different shuffle every step, the same on every replica and in a resumed run.
  loop.seed = spec.trainer().seed() * 1000003 + rl_step;
  // A prompt's samples stay together, so a micro-batch computes the prompt once.
  loop.shuffle_group = RowsPerPrompt(spec);
  loop.micro.micro_batch = train.ppo_micro_batch_size_per_gpu();
  loop.micro.micro_batch_tokens = train.use_dynamic_bsz() ? train.ppo_max_token_len_per_gpu() : 0;
  // Padded rows, except where the model packs them through the variable-length attention kernel
  // (ForwardMicroBatch decides: a GPU in bf16 / fp16).
  loop.micro.packed = false;
  loop.micro.activation_checkpointing = train.gradient_checkpointing();
  loop.grad_clip = train.grad_clip();
  loop.lr = train.lr();
  loop.schedule = schedule;
  loop.first_optimizer_step = first_step;
  loop.loss_horizon = spec.data().max_response_length();
  loop.role = stages::RoleName(role);
  loop.max_nonfinite_skips = spec.trainer().max_nonfinite_skips();
  loop.nonfinite_skips_before = nonfinite_skips;
  return loop;
}

double LogProbTemperature(const v1::JobSpec& spec) {
  // trainer.mode sft learns (and validates) the data's tokens at temperature 1, whatever its
  // validation generations sample at.
  if (spec.trainer().mode() == v1::TRAINER_MODE_SFT) return 1.0;
  const double temperature = spec.roles().actor().rollout().temperature();
  return temperature > 0 ? temperature : 1.0;
}

train::PolicyUpdateOptions PolicyUpdateOptionsOf(const v1::JobSpec& spec, int replicas,
                                                 int64_t rl_step, const train::LrSchedule* schedule,
                                                 int64_t first_step, int64_t nonfinite_skips) {
  const v1::AlgorithmSpec& algorithm = spec.algorithm();
  const bool kl_loss = algorithms::KlInLoss(algorithm) && algorithm.kl().coef() > 0;
  train::PolicyUpdateOptions options;
  options.loop = UpdateLoopOptionsOf(spec, v1::ROLE_ACTOR, spec.roles().actor().train(), replicas,
                                     rl_step, schedule, first_step, nonfinite_skips);
  options.policy = {.mode = algorithm.policy_loss(),
                    .clip_ratio_low = algorithm.clip_ratio_low(),
                    .clip_ratio_high = algorithm.clip_ratio_high(),
                    .clip_ratio_c = algorithm.clip_ratio_c(),
                    .tau_pos = algorithm.tau_pos(),
                    .tau_neg = algorithm.tau_neg(),
                    .clip_cov_ratio = algorithm.clip_cov_ratio(),
                    .clip_cov_lb = algorithm.clip_cov_lb(),
                    .clip_cov_ub = algorithm.clip_cov_ub(),
                    .kl_cov_ratio = algorithm.kl_cov_ratio(),
                    .ppo_kl_coef = algorithm.ppo_kl_coef(),
                    .dro_beta = algorithm.dro_beta(),
                    .aggregation = algorithm.loss_agg_mode()};
  if (algorithm.policy_loss() == v1::POLICY_LOSS_CLIP_COV) {
    // Clip-Cov's draws, from the step's seed as the loop's shuffles: the same again after a
    // restart at this step.
    options.policy.generator =
        at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(options.loop.seed));
  }
  options.entropy_coeff = algorithm.entropy_coeff();
  options.kl_coef = kl_loss ? algorithm.kl().coef() : 0.0;
  options.kl_estimator = algorithm.kl().estimator();
  options.temperature = LogProbTemperature(spec);
  options.rollout_gap_metrics = algorithms::OldLogProbsFromRollout(spec);
  // The conversations' own tokens (at temperature 1, LogProbTemperature).
  options.supervised = spec.trainer().mode() == v1::TRAINER_MODE_SFT;
  return options;
}

train::CriticUpdateOptions CriticUpdateOptionsOf(const v1::JobSpec& spec, int replicas,
                                                 int64_t rl_step, const train::LrSchedule* schedule,
                                                 int64_t first_step, int64_t nonfinite_skips) {
  const v1::TrainSpec& train = spec.roles().critic().train();
  train::CriticUpdateOptions options;
  options.loop = UpdateLoopOptionsOf(spec, v1::ROLE_CRITIC, train, replicas, rl_step, schedule,
                                     first_step, nonfinite_skips);
  options.value_clip = train.cliprange_value();
  options.aggregation = spec.algorithm().loss_agg_mode();
  return options;
}

at::ScalarType WeightDtype(const v1::JobSpec& spec, const at::Device& device, bool trains) {
  if (device.is_cpu() || trains) return at::kFloat;
  switch (spec.model().dtype()) {
    case v1::DTYPE_FP16:
      return at::kHalf;
    case v1::DTYPE_FP32:
      return at::kFloat;
    default:
      return at::kBFloat16;
  }
}

ComputeScope::ComputeScope(const v1::JobSpec& spec, const at::Device& device) {
  const at::ScalarType dtype = WeightDtype(spec, device, /*trains=*/false);
  if (!device.is_cuda() || dtype == at::kFloat) return;
  enabled_ = true;
  was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
  was_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
}

ComputeScope::~ComputeScope() {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
  at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
  at::autocast::clear_cache();
}

}  // namespace rlhfd::roles

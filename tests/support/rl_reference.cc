#include "tests/support/rl_reference.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include "common/models/lora_targets.h"
#include "worker/model/lora.h"
#include "worker/model/model_loader.h"
#include "worker/model/state_dict.h"
#include "worker/train/advantage.h"
#include "worker/train/critic_update.h"
#include "worker/train/losses.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/policy_update.h"
#include "worker/train/trained_model.h"

namespace rlhfd::testing {
namespace {

model::Transformer MustLoad(const std::string& dir, model::HeadNeed head, bool fresh_head,
                            uint64_t seed) {
  model::LoadOptions options;
  options.head = head;
  options.fresh_score_head = fresh_head;
  options.seed = seed;
  options.max_sequence_length = model::LoadOptions::kNoForward;
  auto loaded = model::LoadModel(dir, options);
  REQUIRE(loaded.ok());
  return *loaded;
}

at::Tensor Pad(const at::Tensor& per_token, int64_t prompt_length) {
  return at::constant_pad_nd(per_token, {prompt_length - 1, 0});
}

train::UpdateLoopOptions Loop(const v1::JobSpec& spec, const v1::TrainSpec& train, int64_t step,
                              const train::LrSchedule& schedule, int64_t first_step) {
  train::UpdateLoopOptions loop;
  loop.mini_batch = int64_t{train.ppo_mini_batch_size()} * spec.roles().actor().rollout().n();
  loop.epochs = train.ppo_epochs();
  loop.seed = spec.trainer().seed() * 1000003 + step;
  loop.shuffle_group = spec.roles().actor().rollout().n();
  loop.micro.micro_batch = train.ppo_micro_batch_size_per_gpu();
  loop.micro.packed = false;
  loop.grad_clip = train.grad_clip();
  loop.lr = train.lr();
  loop.schedule = &schedule;
  loop.first_optimizer_step = first_step;
  loop.loss_horizon = spec.data().max_response_length();
  return loop;
}

int64_t StepsPerRlStep(const v1::JobSpec& spec, const v1::TrainSpec& train) {
  return (spec.data().train_batch_size() / train.ppo_mini_batch_size()) * train.ppo_epochs();
}

int64_t ScheduleLength(const v1::JobSpec& spec, const v1::TrainSpec& train) {
  return std::max<int64_t>(1, spec.trainer().total_steps()) * StepsPerRlStep(spec, train);
}

train::AdamWOptions Adam(const v1::TrainSpec& train) {
  return {.beta1 = train.adam_beta1(),
          .beta2 = train.adam_beta2(),
          .eps = 1e-8,
          .weight_decay = train.weight_decay()};
}

}  // namespace

StepTensors MergeDumps(const std::vector<std::string>& paths) {
  std::map<std::string, std::vector<at::Tensor>> parts;
  for (const std::string& path : paths) {
    auto dump = model::StateDict::Load(path);
    REQUIRE(dump.ok());
    for (const std::string& name : dump->names()) parts[name].push_back(dump->Get(name)->clone());
  }
  StepTensors merged;
  for (auto& [name, list] : parts) merged.tensors[name] = at::cat(list);
  const at::Tensor& ids = merged.tensors.at("input_ids");
  const int64_t response_length = merged.tensors.at("response_mask").size(1);
  merged.prompt_length = ids.size(1) - response_length;
  return merged;
}

ReferenceModels LoadReferenceModels(const v1::JobSpec& spec) {
  ReferenceModels models;
  const uint64_t seed = static_cast<uint64_t>(spec.trainer().seed());
  models.actor = MustLoad(spec.model().path(), model::HeadNeed::kCausalLm, false, seed);
  if (spec.model().lora_rank() > 0) {
    // Fresh adapters on the layers named, drawn with the job's seed (the product's draw, which
    // lora_test holds to PEFT's initialisation); the reference below loads the base apart.
    auto layers = models::ResolveLoraTargets(std::vector<std::string>(
        spec.model().target_modules().begin(), spec.model().target_modules().end()));
    REQUIRE(layers.ok());
    REQUIRE(model::AddLoraAdapters(models.actor,
                                   {.rank = spec.model().lora_rank(),
                                    .alpha = spec.model().lora_alpha(),
                                    .layers = *layers},
                                   seed)
                .ok());
  }
  if (spec.roles().has_critic()) {
    const std::string dir = spec.roles().critic().model_path().empty()
                                ? spec.model().path()
                                : spec.roles().critic().model_path();
    models.critic = MustLoad(dir, model::HeadNeed::kScore, true, seed);
  }
  if (spec.roles().has_reference()) {
    models.reference = MustLoad(spec.model().path(), model::HeadNeed::kCausalLm, false, seed);
  }
  if (!spec.roles().reward().model().empty()) {
    models.reward = MustLoad(spec.roles().reward().model(), model::HeadNeed::kScore, false, seed);
  }
  return models;
}

at::Tensor ResponseLogProbs(const v1::JobSpec& spec, model::Transformer& model,
                            const StepTensors& generated) {
  at::NoGradGuard no_grad;
  const auto& t = generated.tensors;
  const at::Tensor ids = t.at("input_ids"), mask = t.at("attention_mask");
  const at::Tensor response_mask = t.at("response_mask");
  const int64_t p = generated.prompt_length, r = response_mask.size(1);
  // From full logits: position j predicts token j + 1.
  const double temperature = spec.roles().actor().rollout().temperature() > 0
                                 ? spec.roles().actor().rollout().temperature()
                                 : 1.0;
  const at::Tensor logits =
      model->Logits(model->Hidden({.input_ids = ids, .attention_mask = mask})) / temperature;
  const at::Tensor all = at::log_softmax(logits.narrow(1, 0, ids.size(1) - 1).to(at::kDouble), -1)
                             .gather(-1, ids.narrow(1, 1, ids.size(1) - 1).unsqueeze(-1))
                             .squeeze(-1);
  return (all.narrow(1, p - 1, r) * response_mask).to(at::kFloat);
}

StepTensors ReferenceForwards(const v1::JobSpec& spec, ReferenceModels& models,
                              const StepTensors& generated, double kl_coef,
                              const at::Tensor& given_scores) {
  at::NoGradGuard no_grad;
  StepTensors out = generated;
  auto& t = out.tensors;
  const at::Tensor ids = t.at("input_ids"), mask = t.at("attention_mask");
  const at::Tensor response_mask = t.at("response_mask");
  const int64_t p = generated.prompt_length, r = response_mask.size(1);
  const auto log_probs = [&](model::Transformer& model) {
    return ResponseLogProbs(spec, model, generated);
  };
  // verl's bypass mode: the rollout's log-probs are the old ones.
  const v1::RolloutCorrectionSpec& correction = spec.algorithm().rollout_correction();
  t["old_log_probs"] =
      correction.bypass_mode() ? t.at("rollout_log_probs") : log_probs(models.actor);
  if (models.reference) t["ref_log_probs"] = log_probs(models.reference);
  if (models.critic) {
    const at::Tensor values =
        models.critic->Scores(models.critic->Hidden({.input_ids = ids, .attention_mask = mask}))
            .squeeze(-1);
    t["values"] = (values.narrow(1, p - 1, r) * response_mask).to(at::kFloat);
  }
  at::Tensor scores = given_scores;
  if (!scores.defined()) {
    const at::Tensor hidden = models.reward->Hidden({.input_ids = ids, .attention_mask = mask});
    const at::Tensor last = (at::arange(mask.size(1)).unsqueeze(0) * mask).argmax(1);
    scores = models.reward->Scores(hidden.index({at::arange(ids.size(0)), last})).select(-1, 0);
  }
  t["scores"] = scores.to(at::kFloat);
  const at::Tensor lengths = response_mask.sum(1).to(at::kLong);
  at::Tensor token_rewards = at::zeros_like(response_mask);
  for (int64_t row = 0; row < ids.size(0); ++row) {
    const int64_t length = lengths[row].item<int64_t>();
    if (length > 0) token_rewards[row][length - 1] = t["scores"][row];
  }
  const v1::AlgorithmSpec& algorithm = spec.algorithm();
  if (algorithm.kl().mode() == v1::KL_MODE_IN_REWARD) {
    token_rewards = token_rewards - kl_coef *
                                        train::KlEstimate(t["old_log_probs"], t["ref_log_probs"],
                                                          algorithm.kl().estimator()) *
                                        response_mask;
  }
  t["token_rewards"] = token_rewards;
  train::AdvantageInput input;
  input.token_rewards = token_rewards;
  input.mask = response_mask;
  if (t.count("values")) input.values = t["values"];
  input.group = at::arange(ids.size(0)).div(spec.roles().actor().rollout().n(), "floor");
  input.gamma = algorithm.gamma();
  input.lam = algorithm.lam();
  input.norm_adv_by_std = algorithm.norm_adv_by_std_in_grpo();
  auto estimator = train::MakeAdvantageEstimator(algorithm.adv_estimator());
  REQUIRE(estimator.ok());
  auto advantages = (*estimator)->Compute(input);
  REQUIRE(advantages.ok());
  t["advantages"] = advantages->advantages.to(at::kFloat);
  t["returns"] = advantages->returns.to(at::kFloat);
  return out;
}

void ReferenceUpdates(const v1::JobSpec& spec, ReferenceModels& models, const StepTensors& step,
                      int64_t rl_step) {
  const auto& t = step.tensors;
  const int64_t p = step.prompt_length;
  const v1::AlgorithmSpec& algorithm = spec.algorithm();
  if (models.critic) {
    const v1::TrainSpec& train = spec.roles().critic().train();
    if (!models.critic_training) {
      models.critic_training = std::make_shared<train::LocalModel>(models.critic, Adam(train));
    }
    const train::LrSchedule schedule(train, ScheduleLength(spec, train));
    train::CriticUpdateBatch batch{.input_ids = t.at("input_ids"),
                                   .attention_mask = t.at("attention_mask"),
                                   .response_mask = Pad(t.at("response_mask"), p),
                                   .old_values = Pad(t.at("values"), p),
                                   .returns = Pad(t.at("returns"), p)};
    train::CriticUpdateOptions options;
    options.loop =
        Loop(spec, train, rl_step, schedule, (rl_step - 1) * StepsPerRlStep(spec, train));
    options.value_clip = train.cliprange_value();
    options.aggregation = algorithm.loss_agg_mode();
    REQUIRE(train::UpdateCritic(*models.critic_training, batch, options).ok());
  }
  if (rl_step > spec.trainer().critic_warmup()) {
    const v1::TrainSpec& train = spec.roles().actor().train();
    if (!models.actor_training) {
      models.actor_training = std::make_shared<train::LocalModel>(models.actor, Adam(train));
    }
    const train::LrSchedule schedule(train, ScheduleLength(spec, train));
    const bool kl_loss = algorithm.kl().mode() == v1::KL_MODE_LOSS && algorithm.kl().coef() > 0;
    const v1::RolloutCorrectionSpec& correction = algorithm.rollout_correction();
    const bool is_weights = !correction.rollout_is().empty() && !correction.bypass_mode();
    const bool on_policy =
        train.ppo_epochs() == 1 && train.ppo_mini_batch_size() == spec.data().train_batch_size();
    train::PolicyUpdateBatch batch{
        .input_ids = t.at("input_ids"),
        .attention_mask = t.at("attention_mask"),
        .response_mask = Pad(t.at("response_mask"), p),
        // On-policy (one epoch over one mini-batch of the whole step) the actor takes its own,
        // detached, unless it was given old ones (bypass: the rollout's) or weighs by them;
        // written out here rather than read from the product's rule.
        .old_log_probs = on_policy && !is_weights && !correction.bypass_mode()
                             ? at::Tensor()
                             : Pad(t.at("old_log_probs"), p),
        .advantages = Pad(t.at("advantages"), p),
        .ref_log_probs = kl_loss ? Pad(t.at("ref_log_probs"), p) : at::Tensor()};
    train::PolicyUpdateOptions options;
    options.loop =
        Loop(spec, train, rl_step, schedule, (rl_step - 1) * StepsPerRlStep(spec, train));
    options.policy = {.mode = algorithm.policy_loss(),
                      .clip_ratio_low = algorithm.clip_ratio_low(),
                      .clip_ratio_high = algorithm.clip_ratio_high(),
                      .clip_ratio_c = algorithm.clip_ratio_c(),
                      .tau_pos = algorithm.tau_pos(),
                      .tau_neg = algorithm.tau_neg(),
                      .aggregation = algorithm.loss_agg_mode()};
    options.entropy_coeff = algorithm.entropy_coeff();
    options.kl_coef = kl_loss ? algorithm.kl().coef() : 0.0;
    options.kl_estimator = algorithm.kl().estimator();
    options.temperature = spec.roles().actor().rollout().temperature() > 0
                              ? spec.roles().actor().rollout().temperature()
                              : 1.0;
    if (is_weights) {
      // verl's truncated importance weights, written out.
      const at::Tensor response = t.at("response_mask").to(at::kDouble);
      const at::Tensor d =
          (t.at("old_log_probs") - t.at("rollout_log_probs")).to(at::kDouble) * response;
      at::Tensor w = correction.rollout_is() == "sequence"
                         ? d.sum(1, true).clamp(-20, 20).exp().expand_as(d) * response
                         : d.clamp(-20, 20).exp() * response;
      w = w.clamp_max(correction.rollout_is_threshold());
      if (correction.rollout_is_batch_normalize()) {
        const at::Tensor mean = correction.rollout_is() == "sequence"
                                    ? (w.sum(1) / response.sum(1).clamp_min(1)).mean()
                                    : w.sum() / response.sum();
        w = w / mean;
      }
      batch.rollout_is_weights = Pad(w.to(at::kFloat), p);
    }
    REQUIRE(train::UpdatePolicy(*models.actor_training, batch, options).ok());
  }
}

std::map<std::string, at::Tensor> SavedWeights(const std::string& role_dir,
                                               model::Transformer& like) {
  auto first = model::StateDict::Load(role_dir + "/rank_0/state.safetensors");
  REQUIRE(first.ok());
  std::map<std::string, at::Tensor> out;
  const auto named = like->named_parameters();
  if (first->Get("unit.root").ok()) {
    // ZeRO-3: the units' parameter names in module order, and every rank's shard of each.
    std::map<std::string, std::vector<std::string>> units;
    for (const auto& item : named) {
      const std::string& name = item.key();
      const std::string prefix = "model.layers.";
      std::string unit = "unit.root";
      if (name.rfind(prefix, 0) == 0) {
        unit = "unit." + name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size());
      }
      units[unit].push_back(name);
    }
    std::vector<model::StateDict> ranks;
    for (int rank = 0;; ++rank) {
      auto state =
          model::StateDict::Load(absl::StrCat(role_dir, "/rank_", rank, "/state.safetensors"));
      if (!state.ok()) break;
      ranks.push_back(*std::move(state));
    }
    for (const auto& [unit, names] : units) {
      std::vector<at::Tensor> shards;
      for (const model::StateDict& state : ranks) {
        auto shard = state.Get(unit);
        INFO(unit);
        REQUIRE(shard.ok());
        shards.push_back(*shard);
      }
      const at::Tensor flat = at::cat(shards);
      int64_t offset = 0;
      for (const std::string& name : names) {
        const at::Tensor& shape = named[name];
        out[name] = flat.narrow(0, offset, shape.numel()).view(shape.sizes()).clone();
        offset += shape.numel();
      }
    }
    return out;
  }
  for (const auto& item : named) {
    // A frozen parameter (a LoRA model's base) is the model directory's, not the checkpoint's.
    if (!item.value().requires_grad()) continue;
    auto value = first->Get(item.key());
    INFO(item.key());
    REQUIRE(value.ok());
    out[item.key()] = value->clone();
  }
  return out;
}

double LargestDifference(const std::map<std::string, at::Tensor>& a,
                         const std::map<std::string, at::Tensor>& b,
                         const std::vector<std::string>& names) {
  double worst = 0;
  for (const std::string& name : names) {
    INFO(name);
    REQUIRE(a.count(name));
    REQUIRE(b.count(name));
    REQUIRE(a.at(name).sizes() == b.at(name).sizes());
    const double difference =
        (a.at(name).to(at::kDouble) - b.at(name).to(at::kDouble)).abs().max().item<double>();
    worst = std::max(worst, difference);
  }
  return worst;
}

}  // namespace rlhfd::testing

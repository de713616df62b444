#include "tests/roles/step_check.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/algorithms/on_policy.h"
#include "common/config/job_config.h"
#include "controller/cluster/pool_placement.h"
#include "tests/support/subprocess.h"
#include "worker/model/state_dict.h"
#include "worker/rollout/engine.h"

namespace rlhfd::roles::testing {

using algorithms::NeedsOldLogProbs;
using controller::FindPool;
using controller::JobStages;
using controller::StepPlan;
using rlhfd::testing::LargestDifference;
using rlhfd::testing::StepTensors;
using rlhfd::testing::TempDir;

namespace {

const std::string kModels = std::string(RLHFD_FIXTURES_DIR) + "/models/";

// PPO with GAE, the KL in the reward, a reward model; split over 5 ranks.
}  // namespace

const char kPpoJob[] = R"(
name: roles-ppo
model: {path: MODELS/tiny-qwen2, dtype: fp32}
data: {train_files: [unused.jsonl], max_prompt_length: 32, max_response_length: 6,
       train_batch_size: 4}
algorithm: {adv_estimator: gae, gamma: 0.95, lam: 0.9,
            kl: {mode: in_reward, coef: 0.05, estimator: k1}}
roles:
  actor:
    gpus: 2
    train: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 1, lr: 1.0e-5, zero_stage: 2}
    rollout: {n: 1, temperature: 0, log_prob_micro_batch_size_per_gpu: 2}
  critic:
    gpus: 1
    train: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 2, lr: 1.0e-5}
  reference: {gpus: 1}
  reward: {model: MODELS/tiny-qwen2-rm, gpus: 1}
placement: split
trainer: {total_steps: 2, seed: 7}
)";

// GRPO, n = 4, the KL as a loss.
const char kGrpoJob[] = R"(
name: roles-grpo
model: {path: MODELS/tiny-qwen2, dtype: fp32}
data: {train_files: [unused.jsonl], max_prompt_length: 32, max_response_length: 6,
       train_batch_size: 2}
algorithm: {adv_estimator: grpo, kl: {mode: loss, coef: 0.01, estimator: k3}}
roles:
  actor:
    gpus: 2
    train: {ppo_mini_batch_size: 2, ppo_micro_batch_size_per_gpu: 2, lr: 1.0e-5, zero_stage: 2}
    rollout: {n: 4, temperature: 1.0, log_prob_micro_batch_size_per_gpu: 4}
  reference: {gpus: 1}
  reward: {model: MODELS/tiny-qwen2-rm, gpus: 1}
placement: split
trainer: {total_steps: 2, seed: 3}
)";

v1::JobSpec TestSpec(const char* text, const std::vector<std::string>& overrides) {
  const std::string yaml = absl::StrReplaceAll(text, {{"MODELS/", kModels}});
  auto spec = config::ParseJobSpec(yaml, "roles_test.yaml", overrides);
  INFO((spec.ok() ? "" : std::string(spec.status().message())));
  REQUIRE(spec.ok());
  return *spec;
}

std::vector<v1::PromptRow> TestPrompts(int count) {
  const char* const questions[] = {"What is 3 + 4?", "Name a colour.",  "Count to three.",
                                   "Say hello.",     "What is 10 - 7?", "Spell cat."};
  std::vector<v1::PromptRow> prompts;
  for (int i = 0; i < count; ++i) {
    v1::PromptRow row;
    v1::ChatTurn* turn = row.add_chat();
    turn->set_role("user");
    turn->set_content(questions[i % 6]);
    row.set_ground_truth_json("\"7\"");
    prompts.push_back(row);
  }
  return prompts;
}

namespace {

std::vector<int> Ranks(const JobStages& job, v1::Role role) {
  const v1::PoolAssignment* pool = FindPool(job.pools(), role);
  return pool == nullptr ? std::vector<int>()
                         : std::vector<int>(pool->ranks().begin(), pool->ranks().end());
}

}  // namespace

StepTensors Dumped(JobStages& job, int64_t step) {
  auto paths = job.DumpBatch(step);
  REQUIRE(paths.ok());
  std::vector<std::string> actor_paths;
  for (int rank : Ranks(job, v1::ROLE_ACTOR)) actor_paths.push_back((*paths)[rank]);
  return rlhfd::testing::MergeDumps(actor_paths);
}

namespace {

// The parameters that train (a LoRA model's adapters; every parameter otherwise).
std::map<std::string, at::Tensor> Parameters(model::Transformer& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad()) out[item.key()] = item.value().detach();
  }
  return out;
}

// The weights the rollout runs: a LoRA model's merged (PEFT's merge, which lora_test holds the
// product's to), copied.
std::map<std::string, at::Tensor> RolloutWeightsOf(model::Transformer& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, tensor] : model::MergedParameters(model)) {
    out[name] = tensor.detach().clone();
  }
  return out;
}

}  // namespace

std::map<std::string, at::Tensor> SavedParameters(const std::string& directory, int64_t step,
                                                  const std::string& role,
                                                  model::Transformer& like) {
  return rlhfd::testing::SavedWeights(absl::StrCat(directory, "/step_", step, "/", role), like);
}

namespace {

std::vector<std::string> Names(const std::map<std::string, at::Tensor>& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  return names;
}

std::map<std::string, at::Tensor> Cloned(const std::map<std::string, at::Tensor>& tensors) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, tensor] : tensors) out[name] = tensor.clone();
  return out;
}

// The weights after an update agree within 1e-5, and (so that says something at a small
// learning rate) the updates themselves agree to 0.1% of their norm. AdamW's first steps move
// each weight by about lr whatever its gradient, so an element whose gradient is within float
// noise of zero moves either way: the norm, not each element, carries the 0.1%.
void CheckUpdate(const std::map<std::string, at::Tensor>& before,
                 const std::map<std::string, at::Tensor>& ours,
                 const std::map<std::string, at::Tensor>& expected) {
  CHECK(LargestDifference(ours, expected, Names(expected)) < 1e-5);
  double difference = 0, update = 0;
  for (const auto& [name, tensor] : expected) {
    const at::Tensor theirs = (tensor - before.at(name)).to(at::kDouble);
    difference +=
        (ours.at(name).to(at::kDouble) - tensor.to(at::kDouble)).pow(2).sum().item<double>();
    update += theirs.pow(2).sum().item<double>();
  }
  INFO("update norm " << std::sqrt(update) << ", difference norm " << std::sqrt(difference));
  CHECK(std::sqrt(update) > 1e-4);
  CHECK(std::sqrt(difference) < 1e-3 * std::sqrt(update));
}

}  // namespace

namespace {

// A module of `like`'s architecture holding `weights`.
model::Transformer WithWeights(model::Transformer& like,
                               const std::map<std::string, at::Tensor>& weights) {
  model::Transformer copy(like->config());
  at::NoGradGuard no_grad;
  for (auto& item : copy->named_parameters()) item.value().copy_(weights.at(item.key()));
  copy->eval();
  return copy;
}

}  // namespace

double StepKlCoefficient(const v1::JobSpec& spec) {
  return spec.algorithm().kl().mode() == v1::KL_MODE_IN_REWARD ? spec.algorithm().kl().coef() : 0;
}

namespace {

// trainer.mode async: step `step`'s batch (`ours`) was generated by the rollout pool ahead of its
// training. Each response token records the step whose update the weights that sampled it
// include: none newer than the step's own start (step - 1), and a response begins no more than
// max_staleness updates behind it (with partial rollouts it may go on with newer weights). Each
// token's rollout log-prob is the log-prob one process computes for it with those weights (the
// reference's after that step, in `weights_after`), within 1e-4. The staleness metrics agree.
// Returns how many responses span two or more weights.
int64_t CheckAsyncRollout(const v1::JobSpec& spec, model::Transformer& like,
                          const std::map<int64_t, std::map<std::string, at::Tensor>>& weights_after,
                          int64_t step, const controller::Metrics& metrics,
                          const StepTensors& ours) {
  const at::Tensor made_by = ours.tensors.at("rollout_weights_step");
  const at::Tensor response = ours.tensors.at("response_mask") > 0;
  const at::Tensor rollout_log_probs = ours.tensors.at("rollout_log_probs");
  const int64_t staleness = spec.trainer().max_staleness();
  const at::Tensor used = std::get<0>(at::_unique(made_by.masked_select(response))).to(at::kLong);
  for (int64_t i = 0; i < used.numel(); ++i) {
    const int64_t weights_step = used[i].item<int64_t>();
    INFO("tokens sampled with the weights after step " << weights_step);
    CHECK(weights_step <= step - 1);
    REQUIRE(weights_after.count(weights_step) == 1);
    model::Transformer sampler = WithWeights(like, weights_after.at(weights_step));
    const at::Tensor expected = rlhfd::testing::ResponseLogProbs(spec, sampler, ours);
    const at::Tensor these = response & (made_by == static_cast<double>(weights_step));
    CHECK((expected - rollout_log_probs).abs().masked_select(these).max().item<double>() < 1e-4);
  }
  // Per response: the oldest weights within the bound; spanning more than one, a partial one.
  const at::Tensor big = at::full_like(made_by, 1e9);
  const at::Tensor oldest = at::where(response, made_by, big).amin(1);
  const at::Tensor newest = at::where(response, made_by, -big).amax(1);
  CHECK(oldest.min().item<double>() >= static_cast<double>(step - 1 - staleness));
  const double mean_staleness = static_cast<double>(step - 1) - oldest.mean().item<double>();
  CHECK(std::abs(metrics.at("training/off_policy/trajectory_staleness/mean") - mean_staleness) <
        1e-6);
  CHECK(metrics.at("training/off_policy/trajectory_staleness/max") <= staleness);
  CHECK(metrics.at("training/off_policy/trajectory_staleness/max") >= 0);
  const int64_t partial = (newest != oldest).sum().item<int64_t>();
  CHECK(std::abs(metrics.at("training/off_policy/partial_rollout_ratio") -
                 static_cast<double>(partial) / static_cast<double>(oldest.numel())) < 1e-9);
  return partial;
}

}  // namespace

void CheckAgainstOneProcess(const v1::JobSpec& job_spec,
                            const std::vector<stages::StageService*>& services, int prompts,
                            int steps) {
  TempDir dir;
  v1::JobSpec spec = job_spec;
  spec.mutable_trainer()->set_checkpoint_dir(dir.path() + "/checkpoints");
  spec.mutable_trainer()->set_rollout_data_dir(dir.path() + "/dumps");
  JobStages job("job-test", spec, services, {.stage_deadline = absl::Minutes(5)});
  REQUIRE(job.Start(spec.trainer().total_steps()).ok());
  rlhfd::testing::ReferenceModels reference = rlhfd::testing::LoadReferenceModels(spec);
  // one_step_off: step k's rollout runs before step k - 1 trains, with the weights step k - 1
  // started from.
  const bool one_step_off = spec.trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF;
  const bool async = spec.trainer().mode() == v1::TRAINER_MODE_ASYNC;
  const auto plan_of = [&](int64_t step) {
    return StepPlan{.step = step,
                    .prompts = TestPrompts(prompts),
                    .seed = static_cast<uint64_t>(100 + step),
                    .kl_coef = StepKlCoefficient(spec)};
  };
  // async: the pool generates ahead on its own thread, and each token records its weights:
  // the weights after each step's update are kept to check the tokens made with them.
  if (async) job.StartAsyncRollout(plan_of, 1, steps);
  std::map<int64_t, std::map<std::string, at::Tensor>> weights_after;
  int64_t partial_responses = 0;
  std::map<std::string, at::Tensor> rollout_weights = RolloutWeightsOf(reference.actor);
  weights_after[0] = rollout_weights;
  std::map<int64_t, double> rollout_checksums, weights_checksums;
  for (int64_t step = 1; step <= steps; ++step) {
    INFO("step " << step);
    const StepPlan plan = plan_of(step);
    const StepPlan next = plan_of(step + 1);
    auto metrics = job.RunStep(plan, step < steps ? &next : nullptr);
    INFO((metrics.ok() ? "" : std::string(metrics.status().message())));
    REQUIRE(metrics.ok());
    if (one_step_off) {
      CHECK(metrics->at("training/off_policy/trajectory_staleness/mean") == (step == 1 ? 0 : 1));
      CHECK(metrics->count("timing_s/generate_ahead") == (step < steps ? 1 : 0));
    }
    // trainer.verify_weight_sync 1: every rollout checked, and its checksum is that of the
    // weights after the update it should follow (none before step 1, or step 2 one step off).
    if (spec.trainer().verify_weight_sync() == 1) {
      CHECK(metrics->at("actor/weight_sync_ok") == 1);
      CHECK(metrics->at("timing_s/verify_weight_sync") >= 0);
      rollout_checksums[step] = metrics->at("actor/rollout_weights_checksum");
      weights_checksums[step] = metrics->at("actor/weights_checksum");
      const int64_t lag = one_step_off ? 2 : 1;
      if (step > lag) {
        CHECK(rollout_checksums[step] == weights_checksums[step - lag]);
      } else {
        CHECK(rollout_checksums[step] == rollout_checksums[1]);
      }
      if (step > 1) CHECK((rollout_checksums[step] != rollout_checksums[step - 1]) == (step > lag));
    }
    if (async) {
      partial_responses += CheckAsyncRollout(spec, reference.actor, weights_after, step, *metrics,
                                             Dumped(job, step));
    }
    CHECK(metrics->count("timing_s/step"));
    CHECK(metrics->count("actor/pg_loss"));
    // The weight sync is part of generating; the MFU is against verl's CPU figure (448 GFLOP/s)
    // and tiny for these models, but measured; peak memory is a GPU figure.
    CHECK(metrics->at("timing_s/update_weights") >= 0);
    CHECK(metrics->at("timing_s/update_weights") <= metrics->at("timing_s/gen"));
    CHECK(metrics->at("perf/mfu/actor") > 0);
    CHECK(metrics->at("perf/mfu/actor") < 1);
    CHECK(metrics->count("perf/max_memory_allocated_gb") == 0);
    CHECK(metrics->at("perf/rollout_preemptions") == 0);  // The tiny jobs' caches hold all.
    const StepTensors ours = Dumped(job, step);
    // The rollout: greedy responses are those of one engine over all prompts; sampled ones
    // are taken as the workers drew them (their seeds do not depend on the layout, but a
    // batch's arithmetic may).
    if (spec.roles().actor().rollout().temperature() == 0 && !async) {
      model::Transformer rollout_model = WithWeights(reference.actor, rollout_weights);
      auto engine = rollout::GenerationEngine::Create(rollout_model, {});
      REQUIRE(engine.ok());
      const at::Tensor ids = ours.tensors.at("input_ids");
      const at::Tensor mask = ours.tensors.at("attention_mask");
      std::vector<rollout::GenerationRequest> requests;
      const int64_t p = ours.prompt_length;
      for (int64_t row = 0; row < ids.size(0); ++row) {
        const int64_t length = mask[row].narrow(0, 0, p).sum().item<int64_t>();
        const at::Tensor prompt = ids[row].narrow(0, p - length, length).contiguous();
        rollout::GenerationRequest request;
        request.prompt_ids.assign(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + length);
        request.sampling.temperature = 0;
        request.sampling.max_new_tokens = spec.data().max_response_length();
        requests.push_back(std::move(request));
      }
      auto results = (*engine)->Generate(requests);
      REQUIRE(results.ok());
      for (int64_t row = 0; row < ids.size(0); ++row) {
        const std::vector<int64_t>& expected = (*results)[row].samples[0].token_ids;
        const int64_t length = ours.tensors.at("response_mask")[row].sum().item<int64_t>();
        REQUIRE(length == static_cast<int64_t>(expected.size()));
        CHECK(at::equal(ids[row].narrow(0, p, length), at::tensor(expected, at::kLong)));
      }
    }
    const StepTensors expected =
        rlhfd::testing::ReferenceForwards(spec, reference, ours, plan.kl_coef);
    std::vector<std::string> compared = {"scores", "token_rewards", "advantages", "returns"};
    // On-policy without a KL reward the old-log-prob forward is skipped: none were made (in
    // bypass mode the rollout's stand in).
    if (NeedsOldLogProbs(spec) || algorithms::OldLogProbsFromRollout(spec)) {
      compared.push_back("old_log_probs");
    } else {
      CHECK(ours.tensors.count("old_log_probs") == 0);
    }
    // The rollout sampled from the distribution the trainer takes log-probs of (its temperature,
    // no top-k / top-p here): on the weights it sampled with, the two agree.
    if (NeedsOldLogProbs(spec) && !one_step_off && !async) {
      CHECK(LargestDifference(ours.tensors,
                              {{"rollout_log_probs", ours.tensors.at("old_log_probs")}},
                              {"rollout_log_probs"}) < 1e-4);
    }
    if (algorithms::OldLogProbsFromRollout(spec)) {
      // verl's bypass loss reports the gap between the trained policy and the rollout's.
      CHECK(metrics->count("rollout_corr/kl") == 1);
      CHECK(metrics->at("rollout_corr/k3_kl") >= 0);
    }
    if (algorithms::AppliesRolloutIsWeights(spec)) {
      const v1::RolloutCorrectionSpec& correction = spec.algorithm().rollout_correction();
      CHECK(metrics->at("rollout_corr/rollout_is_mean") > 0);
      // Token weights are truncated at the threshold (the sequence extremes are raw, as verl's).
      if (correction.rollout_is() == "token") {
        CHECK(metrics->at("rollout_corr/rollout_is_max") <= correction.rollout_is_threshold());
      }
      CHECK(metrics->at("rollout_corr/rollout_is_ratio_fraction_high") >= 0);
      CHECK(metrics->at("rollout_corr/rollout_is_ratio_fraction_high") <= 1);
      CHECK(metrics->count("rollout_corr/k3_kl") == 1);
    }
    if (spec.roles().has_reference()) compared.push_back("ref_log_probs");
    if (spec.roles().has_critic()) compared.push_back("values");
    const double difference = LargestDifference(ours.tensors, expected.tensors, compared);
    CHECK(difference < 1e-5);
    // The advantages are not all zero: the comparison says something.
    CHECK(expected.tensors.at("advantages").abs().max().item<double>() > 1e-3);

    const auto actor_before = Cloned(Parameters(reference.actor));
    // The next rollout's weights: these (one_step_off), or those after this step's update.
    if (one_step_off) rollout_weights = RolloutWeightsOf(reference.actor);
    const auto critic_before = reference.critic ? Cloned(Parameters(reference.critic))
                                                : std::map<std::string, at::Tensor>();
    rlhfd::testing::ReferenceUpdates(spec, reference, expected, step);
    REQUIRE(job.SaveCheckpoint(step, false).ok());
    const auto actor = Parameters(reference.actor);
    if (!one_step_off) rollout_weights = RolloutWeightsOf(reference.actor);
    weights_after[step] = RolloutWeightsOf(reference.actor);
    CheckUpdate(actor_before,
                SavedParameters(dir.path() + "/checkpoints", step, "actor", reference.actor),
                actor);
    if (reference.critic) {
      const auto critic = Parameters(reference.critic);
      CheckUpdate(critic_before,
                  SavedParameters(dir.path() + "/checkpoints", step, "critic", reference.critic),
                  critic);
    }
  }
  job.End();
  // With partial rollouts (and decode steps held long enough, as the async tests' hosts are), a
  // weight update interrupted some response: its tokens came from two updates' weights.
  if (async && spec.roles().rollout().partial_rollout()) CHECK(partial_responses > 0);
}

}  // namespace rlhfd::roles::testing

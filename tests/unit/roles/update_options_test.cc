// The config → update-options wiring of the actor and critic (roles::PolicyUpdateOptionsOf and
// CriticUpdateOptionsOf) against options written out by hand from the job texts: an oracle that
// shares no code with the product's mapping, for the stage tests' PPO and GRPO jobs and for a job
// that sets every option the mapping reads to a value other than its default.
#include <catch2/catch.hpp>

#include "tests/roles/step_check.h"
#include "worker/roles/training_setup.h"
#include "worker/train/lr_schedule.h"

namespace rlhfd::roles {
namespace {

using testing::kGrpoJob;
using testing::kPpoJob;
using testing::TestSpec;

// kPpoJob with every option read by the update-options mapping away from its default: the KL as
// a loss (k2), other clip ratios and aggregation, an entropy bonus, token-budget micro-batches,
// activation checkpointing, two epochs, clipping, a non-finite budget, n = 2.
const char kEveryOptionJob[] = R"(
name: every-option
model: {path: MODELS/tiny-qwen2, dtype: fp32}
data: {train_files: [unused.jsonl], max_prompt_length: 32, max_response_length: 9,
       train_batch_size: 4}
algorithm: {adv_estimator: gae, gamma: 0.95, lam: 0.9,
            kl: {mode: loss, coef: 0.02, estimator: k2},
            clip_ratio_low: 0.1, clip_ratio_high: 0.28, clip_ratio_c: 5.0, entropy_coeff: 0.001,
            loss_agg_mode: seq-mean-token-sum-norm, policy_loss: sapo, tau_pos: 1.5, tau_neg: 2.5,
            clip_cov_ratio: 0.01, clip_cov_lb: 0.5, clip_cov_ub: 4.0, kl_cov_ratio: 0.02,
            ppo_kl_coef: 0.2, dro_beta: 0.3}
roles:
  actor:
    gpus: 2
    train: {ppo_mini_batch_size: 2, ppo_micro_batch_size_per_gpu: 1, lr: 3.0e-6, zero_stage: 2,
            use_dynamic_bsz: true, ppo_max_token_len_per_gpu: 300, grad_clip: 0.7, ppo_epochs: 2,
            gradient_checkpointing: true}
    rollout: {n: 2, temperature: 1.0, log_prob_micro_batch_size_per_gpu: 2}
  critic:
    gpus: 1
    train: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 2, lr: 2.0e-5,
            use_dynamic_bsz: true, ppo_max_token_len_per_gpu: 500, grad_clip: 0.3, ppo_epochs: 3,
            gradient_checkpointing: true, cliprange_value: 0.25}
  reference: {gpus: 1}
  reward: {model: MODELS/tiny-qwen2-rm, gpus: 1}
placement: split
trainer: {total_steps: 2, seed: 11, max_nonfinite_skips: 5}
)";

void CheckLoop(const train::UpdateLoopOptions& got, const train::UpdateLoopOptions& expected) {
  CHECK(got.mini_batch == expected.mini_batch);
  CHECK(got.epochs == expected.epochs);
  CHECK(got.seed == expected.seed);
  CHECK(got.micro.micro_batch == expected.micro.micro_batch);
  CHECK(got.micro.micro_batch_tokens == expected.micro.micro_batch_tokens);
  CHECK(got.micro.packed == expected.micro.packed);
  CHECK(got.micro.activation_checkpointing == expected.micro.activation_checkpointing);
  CHECK(got.grad_clip == expected.grad_clip);
  CHECK(got.lr == expected.lr);
  CHECK(got.schedule == expected.schedule);
  CHECK(got.first_optimizer_step == expected.first_optimizer_step);
  CHECK(got.loss_horizon == expected.loss_horizon);
  CHECK(got.role == expected.role);
  CHECK(got.max_nonfinite_skips == expected.max_nonfinite_skips);
  CHECK(got.nonfinite_skips_before == expected.nonfinite_skips_before);
}

void CheckPolicy(const train::PolicyUpdateOptions& got,
                 const train::PolicyUpdateOptions& expected) {
  CheckLoop(got.loop, expected.loop);
  CHECK(got.policy.mode == expected.policy.mode);
  CHECK(got.policy.tau_pos == expected.policy.tau_pos);
  CHECK(got.policy.tau_neg == expected.policy.tau_neg);
  CHECK(got.policy.clip_ratio_low == expected.policy.clip_ratio_low);
  CHECK(got.policy.clip_ratio_high == expected.policy.clip_ratio_high);
  CHECK(got.policy.clip_ratio_c == expected.policy.clip_ratio_c);
  CHECK(got.policy.clip_cov_ratio == expected.policy.clip_cov_ratio);
  CHECK(got.policy.clip_cov_lb == expected.policy.clip_cov_lb);
  CHECK(got.policy.clip_cov_ub == expected.policy.clip_cov_ub);
  CHECK(got.policy.kl_cov_ratio == expected.policy.kl_cov_ratio);
  CHECK(got.policy.ppo_kl_coef == expected.policy.ppo_kl_coef);
  CHECK(got.policy.dro_beta == expected.policy.dro_beta);
  // Only Clip-Cov draws at random: its generator seeded with the step's seed.
  REQUIRE(got.policy.generator.has_value() == (got.policy.mode == v1::POLICY_LOSS_CLIP_COV));
  if (got.policy.generator) {
    CHECK(got.policy.generator->current_seed() == static_cast<uint64_t>(got.loop.seed));
  }
  CHECK(got.policy.aggregation == expected.policy.aggregation);
  CHECK(got.entropy_coeff == expected.entropy_coeff);
  CHECK(got.kl_coef == expected.kl_coef);
  CHECK(got.kl_estimator == expected.kl_estimator);
}

void CheckCritic(const train::CriticUpdateOptions& got,
                 const train::CriticUpdateOptions& expected) {
  CheckLoop(got.loop, expected.loop);
  CHECK(got.value_clip == expected.value_clip);
  CHECK(got.aggregation == expected.aggregation);
}

// The arguments that come from the running job rather than the config.
constexpr int kActorReplicas = 2, kCriticReplicas = 1;
constexpr int64_t kRlStep = 2, kFirstStep = 1, kSkipsBefore = 0;

TEST_CASE("PPO job: actor and critic update options", "[update_options]") {
  const v1::JobSpec spec = TestSpec(kPpoJob);
  const train::LrSchedule schedule(spec.roles().actor().train(), 2);
  train::PolicyUpdateOptions actor;
  actor.loop = {.mini_batch = 2,  // ppo_mini_batch_size 4 x n 1 / 2 replicas
                .epochs = 1,
                .seed = 7 * 1000003 + 2,
                .micro = {.micro_batch = 1,
                          .micro_batch_tokens = 0,
                          .packed = false,
                          .activation_checkpointing = false},
                .grad_clip = 1.0,
                .lr = 1e-5,
                .schedule = &schedule,
                .first_optimizer_step = 1,
                .loss_horizon = 6,
                .role = "actor",
                .max_nonfinite_skips = 0,
                .nonfinite_skips_before = 0};
  actor.policy = {.clip_ratio_low = 0.2,
                  .clip_ratio_high = 0.2,
                  .clip_ratio_c = 3.0,
                  .aggregation = v1::LOSS_AGGREGATION_TOKEN_MEAN};
  actor.entropy_coeff = 0;
  actor.kl_coef = 0;  // The KL is in the reward, not a loss.
  actor.kl_estimator = v1::KL_ESTIMATOR_K1;
  CheckPolicy(
      PolicyUpdateOptionsOf(spec, kActorReplicas, kRlStep, &schedule, kFirstStep, kSkipsBefore),
      actor);

  train::CriticUpdateOptions critic;
  critic.loop = {.mini_batch = 4,  // 4 x 1 / 1
                 .epochs = 1,
                 .seed = 7 * 1000003 + 2,
                 .micro = {.micro_batch = 2,
                           .micro_batch_tokens = 0,
                           .packed = false,
                           .activation_checkpointing = false},
                 .grad_clip = 1.0,
                 .lr = 1e-5,
                 .schedule = &schedule,
                 .first_optimizer_step = 1,
                 .loss_horizon = 6,
                 .role = "critic",
                 .max_nonfinite_skips = 0,
                 .nonfinite_skips_before = 0};
  critic.value_clip = 0.5;
  critic.aggregation = v1::LOSS_AGGREGATION_TOKEN_MEAN;
  CheckCritic(
      CriticUpdateOptionsOf(spec, kCriticReplicas, kRlStep, &schedule, kFirstStep, kSkipsBefore),
      critic);
}

TEST_CASE("GRPO job: actor update options", "[update_options]") {
  const v1::JobSpec spec = TestSpec(kGrpoJob);
  const train::LrSchedule schedule(spec.roles().actor().train(), 2);
  train::PolicyUpdateOptions actor;
  actor.loop = {.mini_batch = 4,  // ppo_mini_batch_size 2 x n 4 / 2 replicas
                .epochs = 1,
                .seed = 3 * 1000003 + 2,
                .micro = {.micro_batch = 2,
                          .micro_batch_tokens = 0,
                          .packed = false,
                          .activation_checkpointing = false},
                .grad_clip = 1.0,
                .lr = 1e-5,
                .schedule = &schedule,
                .first_optimizer_step = 1,
                .loss_horizon = 6,
                .role = "actor",
                .max_nonfinite_skips = 0,
                .nonfinite_skips_before = 0};
  actor.policy = {.clip_ratio_low = 0.2,
                  .clip_ratio_high = 0.2,
                  .clip_ratio_c = 3.0,
                  .aggregation = v1::LOSS_AGGREGATION_TOKEN_MEAN};
  actor.entropy_coeff = 0;
  actor.kl_coef = 0.01;
  actor.kl_estimator = v1::KL_ESTIMATOR_K3;
  CheckPolicy(
      PolicyUpdateOptionsOf(spec, kActorReplicas, kRlStep, &schedule, kFirstStep, kSkipsBefore),
      actor);
}

TEST_CASE("every option set: actor and critic update options", "[update_options]") {
  const v1::JobSpec spec = TestSpec(kEveryOptionJob);
  const train::LrSchedule schedule(spec.roles().actor().train(), 8);
  train::PolicyUpdateOptions actor;
  actor.loop = {.mini_batch = 2,  // ppo_mini_batch_size 2 x n 2 / 2 replicas
                .epochs = 2,
                .seed = 11 * 1000003 + 5,
                .micro = {.micro_batch = 1,
                          .micro_batch_tokens = 300,
                          .packed = false,
                          .activation_checkpointing = true},
                .grad_clip = 0.7,
                .lr = 3e-6,
                .schedule = &schedule,
                .first_optimizer_step = 16,
                .loss_horizon = 9,
                .role = "actor",
                .max_nonfinite_skips = 5,
                .nonfinite_skips_before = 3};
  actor.policy = {.mode = v1::POLICY_LOSS_SAPO,
                  .clip_ratio_low = 0.1,
                  .clip_ratio_high = 0.28,
                  .clip_ratio_c = 5.0,
                  .tau_pos = 1.5,
                  .tau_neg = 2.5,
                  .clip_cov_ratio = 0.01,
                  .clip_cov_lb = 0.5,
                  .clip_cov_ub = 4.0,
                  .kl_cov_ratio = 0.02,
                  .ppo_kl_coef = 0.2,
                  .dro_beta = 0.3,
                  .aggregation = v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM};
  actor.entropy_coeff = 0.001;
  actor.kl_coef = 0.02;
  actor.kl_estimator = v1::KL_ESTIMATOR_K2;
  CheckPolicy(PolicyUpdateOptionsOf(spec, 2, 5, &schedule, 16, 3), actor);
  // The same job with Clip-Cov: its draws seeded like the loop's shuffles.
  v1::JobSpec clip_cov = spec;
  clip_cov.mutable_algorithm()->set_policy_loss(v1::POLICY_LOSS_CLIP_COV);
  actor.policy.mode = v1::POLICY_LOSS_CLIP_COV;
  CheckPolicy(PolicyUpdateOptionsOf(clip_cov, 2, 5, &schedule, 16, 3), actor);

  train::CriticUpdateOptions critic;
  critic.loop = {.mini_batch = 8,  // 4 x 2 / 1
                 .epochs = 3,
                 .seed = 11 * 1000003 + 5,
                 .micro = {.micro_batch = 2,
                           .micro_batch_tokens = 500,
                           .packed = false,
                           .activation_checkpointing = true},
                 .grad_clip = 0.3,
                 .lr = 2e-5,
                 .schedule = &schedule,
                 .first_optimizer_step = 12,
                 .loss_horizon = 9,
                 .role = "critic",
                 .max_nonfinite_skips = 5,
                 .nonfinite_skips_before = 1};
  critic.value_clip = 0.25;
  critic.aggregation = v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM;
  CheckCritic(CriticUpdateOptionsOf(spec, 1, 5, &schedule, 12, 1), critic);
}

}  // namespace
}  // namespace rlhfd::roles

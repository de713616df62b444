// The RL stages through in-process role hosts (one per world rank, sockets between them): a PPO
// step and a GRPO step, split and colocated, against one process computing the same step with
// the engine functions; stored replies; refusals of bad input.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/config/job_config.h"
#include "common/roles/job_stages.h"
#include "common/roles/pool_placement.h"
#include "tests/support/rl_reference.h"
#include "tests/support/subprocess.h"
#include "worker/model/state_dict.h"
#include "worker/roles/role_host.h"
#include "worker/rollout/engine.h"

namespace rlhfd::roles {
namespace {

using testing::LargestDifference;
using testing::StepTensors;
using testing::TempDir;

const std::string kModels = std::string(RLHFD_FIXTURES_DIR) + "/models/";

// PPO with GAE, the KL in the reward, a reward model; split over 5 ranks.
constexpr char kPpo[] = R"(
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
constexpr char kGrpo[] = R"(
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

v1::JobSpec Spec(const char* text, const std::vector<std::string>& overrides = {}) {
  const std::string yaml = absl::StrReplaceAll(text, {{"MODELS/", kModels}});
  auto spec = config::ParseJobSpec(yaml, "roles_test.yaml", overrides);
  INFO((spec.ok() ? "" : std::string(spec.status().message())));
  REQUIRE(spec.ok());
  return *spec;
}

std::vector<v1::PromptRow> Prompts(int count) {
  const char* const questions[] = {"What is 3 + 4?", "Name a colour.", "Count to three.",
                                   "Say hello.", "What is 10 - 7?", "Spell cat."};
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

// One role host per world rank of `spec`, on loopback.
struct Hosts {
  explicit Hosts(const v1::JobSpec& spec) {
    const int world = WorldSize(PlacePools(spec));
    for (int r = 0; r < world; ++r) {
      hosts.push_back(std::make_unique<RoleHost>(RoleHostOptions{
          .device = at::kCPU, .host = "127.0.0.1", .collective_timeout = std::chrono::seconds(60)}));
      services.push_back(hosts.back().get());
    }
  }
  std::vector<std::unique_ptr<RoleHost>> hosts;
  std::vector<StageService*> services;
};

std::vector<int> Ranks(const JobStages& job, const std::string& role) {
  const v1::PoolAssignment* pool = FindPool(job.pools(), role);
  return pool == nullptr ? std::vector<int>() : std::vector<int>(pool->ranks().begin(), pool->ranks().end());
}

// The actor ranks' dumps of `step`, merged in row order.
StepTensors Dumped(JobStages& job, int64_t step, const std::string& directory) {
  auto paths = job.DumpBatch(step, directory);
  REQUIRE(paths.ok());
  std::vector<std::string> actor_paths;
  for (int rank : Ranks(job, "actor")) actor_paths.push_back((*paths)[rank]);
  return testing::MergeDumps(actor_paths);
}

std::map<std::string, at::Tensor> Parameters(model::Transformer& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value().detach();
  return out;
}

// A role's parameters as its data-parallel rank 0 saved them.
std::map<std::string, at::Tensor> SavedParameters(const std::string& directory, int64_t step,
                                                  const std::string& role,
                                                  const std::map<std::string, at::Tensor>& like) {
  auto saved = model::StateDict::Load(
      absl::StrCat(directory, "/step_", step, "/", role, "/rank_0/state.safetensors"));
  REQUIRE(saved.ok());
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, tensor] : like) {
    auto value = saved->Get(name);
    REQUIRE(value.ok());
    out[name] = value->clone();
  }
  return out;
}

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
    difference += (ours.at(name).to(at::kDouble) - tensor.to(at::kDouble)).pow(2).sum().item<double>();
    update += theirs.pow(2).sum().item<double>();
  }
  INFO("update norm " << std::sqrt(update) << ", difference norm " << std::sqrt(difference));
  CHECK(std::sqrt(update) > 1e-4);
  CHECK(std::sqrt(difference) < 1e-3 * std::sqrt(update));
}

// Runs `steps` steps of `spec` through role hosts and the same steps in one process; every
// intermediate within 1e-5, greedy responses identical to one engine's, weights within 1e-5.
void CheckAgainstOneProcess(const v1::JobSpec& spec, int prompts, int steps) {
  at::set_num_threads(1);
  Hosts hosts(spec);
  JobStages job("job-test", spec, hosts.services, {.stage_deadline = absl::Minutes(5)});
  REQUIRE(job.Start(spec.trainer().total_steps()).ok());
  testing::ReferenceModels reference = testing::LoadReferenceModels(spec);
  TempDir dir;
  const double kl_coef = spec.algorithm().kl().coef();
  for (int64_t step = 1; step <= steps; ++step) {
    INFO("step " << step);
    StepPlan plan{.step = step, .prompts = Prompts(prompts), .seed = 100 + step,
                  .kl_coef = spec.algorithm().kl().mode() == v1::KL_MODE_IN_REWARD ? kl_coef : 0};
    auto metrics = job.RunStep(plan);
    INFO((metrics.ok() ? "" : std::string(metrics.status().message())));
    REQUIRE(metrics.ok());
    CHECK(metrics->count("timing_s/step"));
    CHECK(metrics->count("actor/pg_loss"));
    const StepTensors ours = Dumped(job, step, dir.path() + "/dumps");
    // The rollout: greedy responses are those of one engine over all prompts; sampled ones
    // are taken as the workers drew them (their seeds do not depend on the layout, but a
    // batch's arithmetic may).
    if (spec.roles().actor().rollout().temperature() == 0) {
      auto engine = rollout::GenerationEngine::Create(reference.actor, {});
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
    const StepTensors expected = testing::ReferenceForwards(spec, reference, ours, plan.kl_coef);
    std::vector<std::string> compared = {"old_log_probs", "scores", "token_rewards", "advantages",
                                         "returns"};
    if (spec.roles().has_reference()) compared.push_back("ref_log_probs");
    if (spec.roles().has_critic()) compared.push_back("values");
    const double difference = LargestDifference(ours.tensors, expected.tensors, compared);
    CHECK(difference < 1e-5);
    // The advantages are not all zero: the comparison says something.
    CHECK(expected.tensors.at("advantages").abs().max().item<double>() > 1e-3);

    const auto actor_before = Cloned(Parameters(reference.actor));
    const auto critic_before =
        reference.critic ? Cloned(Parameters(reference.critic)) : std::map<std::string, at::Tensor>();
    testing::ReferenceUpdates(spec, reference, expected, step);
    REQUIRE(job.SaveCheckpoint(dir.path() + "/checkpoints", step, false).ok());
    const auto actor = Parameters(reference.actor);
    CheckUpdate(actor_before, SavedParameters(dir.path() + "/checkpoints", step, "actor", actor),
                actor);
    if (reference.critic) {
      const auto critic = Parameters(reference.critic);
      CheckUpdate(critic_before,
                  SavedParameters(dir.path() + "/checkpoints", step, "critic", critic), critic);
    }
  }
  job.End();
}

TEST_CASE("a PPO step through role hosts, split over 5 ranks, equals one process", "[roles]") {
  CheckAgainstOneProcess(Spec(kPpo), 4, 2);
}

TEST_CASE("a GRPO step (n = 4) through role hosts equals one process", "[roles]") {
  CheckAgainstOneProcess(Spec(kGrpo), 2, 2);
}

TEST_CASE("the same steps colocated give the same numbers", "[roles]") {
  SECTION("PPO, one worker hosting every role") {
    CheckAgainstOneProcess(Spec(kPpo, {"placement=colocated", "roles.actor.gpus=1"}), 4, 2);
  }
  SECTION("GRPO, two workers each hosting every role") {
    CheckAgainstOneProcess(
        Spec(kGrpo, {"placement=colocated", "roles.reference.gpus=2", "roles.reward.gpus=2"}), 2,
        2);
  }
}

// Calls a stage on one host and waits.
template <typename Request, typename Reply>
absl::StatusOr<Reply> Call(RoleHost& host,
                           void (StageService::*method)(const Request&, absl::Duration,
                                                        StageDone<Reply>),
                           const Request& request) {
  return CallStage(host, method, request, absl::Minutes(1));
}

v1::StageKey Key(const std::string& job, int64_t step, const std::string& stage) {
  v1::StageKey key;
  key.set_job_id(job);
  key.set_step(step);
  key.set_stage(stage);
  return key;
}

TEST_CASE("a repeated stage call returns the stored reply and changes no weight", "[roles]") {
  at::set_num_threads(1);
  const v1::JobSpec spec =
      Spec(kGrpo, {"placement=colocated", "roles.actor.gpus=1", "roles.reward.gpus=1",
                   "roles.reference.gpus=1"});
  Hosts hosts(spec);
  JobStages job("job-repeat", spec, hosts.services);
  REQUIRE(job.Start(2).ok());
  REQUIRE(job.RunStep({.step = 1, .prompts = Prompts(2), .seed = 5}).ok());
  TempDir dir;
  REQUIRE(job.SaveCheckpoint(dir.path(), 1, false).ok());
  v1::UpdateRequest update;
  *update.mutable_key() = Key("job-repeat", 1, "update_actor");
  update.set_optimizer_steps_before(0);
  auto again = Call(*hosts.hosts[0], &StageService::UpdateActor, update);
  REQUIRE(again.ok());
  CHECK(again->optimizer_steps() == 1);
  // The same key after the fact: same reply; the weights as saved after the first.
  REQUIRE(job.SaveCheckpoint(dir.path(), 2, false).ok());
  auto first = model::StateDict::Load(dir.path() + "/step_1/actor/rank_0/state.safetensors");
  auto second = model::StateDict::Load(dir.path() + "/step_2/actor/rank_0/state.safetensors");
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  for (const std::string& name : first->names()) {
    INFO(name);
    CHECK(at::equal(*first->Get(name), *second->Get(name)));
  }
  // Generate repeated: the same rows, not a second rollout.
  v1::GenerateRequest generate;
  *generate.mutable_key() = Key("job-repeat", 1, "generate");
  auto regenerated = Call(*hosts.hosts[0], &StageService::Generate, generate);
  REQUIRE(regenerated.ok());
  CHECK(regenerated->rows_size() == 8);
  job.End();
}

TEST_CASE("bad stage input gets a clear error naming what to fix", "[roles]") {
  at::set_num_threads(1);
  const v1::JobSpec spec = Spec(kGrpo, {"placement=colocated", "roles.actor.gpus=1",
                                        "roles.reward.gpus=1", "roles.reference.gpus=1"});
  Hosts hosts(spec);
  RoleHost& host = *hosts.hosts[0];
  const auto message = [](const absl::Status& status) { return std::string(status.message()); };

  SECTION("an unknown job") {
    v1::ForwardRequest forward;
    *forward.mutable_key() = Key("job-nope", 1, "values");
    auto reply = Call(host, &StageService::Forward, forward);
    CHECK(reply.status().code() == absl::StatusCode::kNotFound);
    CHECK_THAT(message(reply.status()), Catch::Contains("job-nope is not running"));
  }
  SECTION("a model directory that does not load") {
    v1::JobSpec broken = spec;
    broken.mutable_model()->set_path("/nonexistent/model");
    JobStages job("job-broken", broken, hosts.services);
    const absl::Status started = job.Start(1);
    CHECK_THAT(message(started), Catch::Contains("/nonexistent/model"));
  }
  SECTION("an unknown reward rule") {
    v1::JobSpec broken = spec;
    broken.mutable_roles()->mutable_reward()->Clear();
    broken.mutable_roles()->mutable_reward()->set_rule("gsm9k");
    JobStages job("job-rule", broken, hosts.services);
    CHECK_THAT(message(job.Start(1)),
               Catch::Contains("roles.reward.rule") && Catch::Contains("gsm9k"));
  }
  SECTION("stages out of order, shapes that do not match, a remote reward that is down") {
    v1::JobSpec remote = spec;
    remote.mutable_roles()->mutable_reward()->Clear();
    const std::string url =
        absl::StrCat("http://127.0.0.1:", testing::FreeLoopbackPort(), "/score");
    remote.mutable_roles()->mutable_reward()->set_remote(url);
    remote.mutable_roles()->mutable_reward()->set_remote_timeout_s(1);
    JobStages job("job-order", remote, hosts.services);
    REQUIRE(job.Start(1).ok());
    v1::AdvantageRequest advantages;
    *advantages.mutable_key() = Key("job-order", 1, "advantages");
    auto early = Call(host, &StageService::ComputeAdvantages, advantages);
    CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(message(early.status()), Catch::Contains("has not generated"));

    v1::GenerateRequest generate;
    *generate.mutable_key() = Key("job-order", 1, "generate");
    for (const v1::PromptRow& row : Prompts(2)) *generate.add_prompts() = row;
    generate.set_total_prompts(2);
    REQUIRE(Call(host, &StageService::Generate, generate).ok());
    auto no_scores = Call(host, &StageService::ComputeAdvantages, advantages);
    CHECK_THAT(message(no_scores.status()),
               Catch::Contains("needs scores") && Catch::Contains("rewards"));

    v1::MoveTensorsRequest move;
    *move.mutable_key() = Key("job-order", 1, "move");
    move.add_tensors("input_ids");
    move.set_from_role("actor");
    move.set_to_role("reference");
    move.set_rows(8);
    move.set_prompt_length(3);
    move.set_response_length(99);
    auto wrong = Call(host, &StageService::MoveTensors, move);
    CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(message(wrong.status()), Catch::Contains("not 8, 3, 99"));

    v1::RewardRequest rewards;
    *rewards.mutable_key() = Key("job-order", 1, "rewards");
    auto down = Call(host, &StageService::ComputeRewards, rewards);
    CHECK(down.status().code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(message(down.status()), Catch::Contains(url));
    job.End();
  }
}

}  // namespace
}  // namespace rlhfd::roles

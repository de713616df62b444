// The RL stages through in-process role hosts (one per world rank, sockets between them): a PPO
// step and a GRPO step, split and colocated, against one process computing the same step with
// the engine functions; stored replies; refusals of bad input.
#include <ATen/ATen.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/config/job_config.h"
#include "common/util/files.h"
#include "controller/cluster/pool_placement.h"
#include "controller/driver/job_stages.h"
#include "tests/roles/step_check.h"
#include "tests/support/subprocess.h"
#include "worker/model/state_dict.h"
#include "worker/roles/checkpoint.h"
#include "worker/roles/hybrid_engine.h"
#include "worker/roles/role_host.h"
#include "worker/rollout/engine.h"

namespace rlhfd::roles {
namespace {

using controller::JobStages;
using controller::PlacePools;
using controller::WorldSize;
using rlhfd::testing::TempDir;
using stages::CallStage;
using stages::StageDone;
using stages::StageService;
using testing::kGrpoJob;
using testing::kPpoJob;
using testing::TestPrompts;
using testing::TestSpec;

// One role host per world rank of `spec`, on loopback.
struct Hosts {
  // `decode_hold`: each decode step of a rollout pool's rank waits this long.
  explicit Hosts(const v1::JobSpec& spec, RolloutWeightsHook hook = nullptr,
                 absl::Duration decode_hold = absl::ZeroDuration()) {
    at::set_num_threads(1);
    const int world = WorldSize(PlacePools(spec));
    for (int r = 0; r < world; ++r) {
      hosts.push_back(std::make_unique<RoleHost>(
          RoleHostOptions{.device = at::kCPU,
                          .host = "127.0.0.1",
                          .collective_timeout = std::chrono::seconds(60),
                          .rollout_weights_hook = hook,
                          .fault_hold_rollout_decode_step = decode_hold}));
      services.push_back(hosts.back().get());
    }
  }
  std::vector<std::unique_ptr<RoleHost>> hosts;
  std::vector<StageService*> services;
};

TEST_CASE("a state holding NaN or infinity is never saved, and latest stays",
          "[roles][nonfinite]") {
  TempDir dir;
  train::TrainedModel::NamedTensors state = {{"model.norm.weight", at::ones({4})},
                                             {"optimizer.step.0", at::ones({})}};
  REQUIRE(SaveRoleState(dir.path(), 1, "actor", 0, state, {}, CheckpointWriter()).ok());
  REQUIRE(CommitStep(dir.path(), 1, CheckpointWriter()).ok());
  state[1].second.fill_(std::numeric_limits<float>::quiet_NaN());
  const absl::StatusOr<int64_t> refused =
      SaveRoleState(dir.path(), 2, "actor", 0, state, {}, CheckpointWriter());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("optimizer.step.0 holds non-finite values"));
  CHECK_FALSE(PathExists(RankDirectory(dir.path(), 2, "actor", 0) + "/manifest.json"));
  CHECK_FALSE(PathExists(RankDirectory(dir.path(), 2, "actor", 0) + "/state.safetensors"));
  // The newest intact committed step is still 1, and it loads.
  const absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestIntact(
      dir.path(), 0,
      {{.role = "actor",
        .rank = 0,
        .state = {{"model.norm.weight", at::zeros({4})}, {"optimizer.step.0", at::zeros({})}}}});
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 1);
}

void CheckAgainstOneProcess(const v1::JobSpec& spec, int prompts, int steps) {
  Hosts hosts(spec);
  testing::CheckAgainstOneProcess(spec, hosts.services, prompts, steps);
}

TEST_CASE("a PPO step through role hosts, split over 5 ranks, equals one process", "[roles]") {
  CheckAgainstOneProcess(TestSpec(kPpoJob), 4, 2);
}

TEST_CASE("a GRPO step (n = 4) through role hosts equals one process", "[roles]") {
  CheckAgainstOneProcess(TestSpec(kGrpoJob), 2, 2);
}

TEST_CASE("the same steps colocated (roles sharing workers) equal one process", "[roles]") {
  SECTION("PPO, one worker hosting every role") {
    CheckAgainstOneProcess(TestSpec(kPpoJob, {"placement=colocated", "roles.actor.gpus=1"}), 4, 2);
  }
  SECTION("GRPO, two workers each hosting every role") {
    CheckAgainstOneProcess(TestSpec(kGrpoJob, {"placement=colocated", "roles.reference.gpus=2",
                                               "roles.reward.gpus=2"}),
                           2, 2);
  }
}

// Two PPO epochs make the update off-policy after its first optimiser step: the old-log-prob
// forward runs (the GRPO job above, one epoch, skips it) and its log-probs are the ratio's.
TEST_CASE(
    "an off-policy GRPO update (two epochs) uses the old-log-prob forward and equals one process",
    "[roles]") {
  CheckAgainstOneProcess(
      TestSpec(kGrpoJob, {"placement=colocated", "roles.actor.gpus=1", "roles.reward.gpus=1",
                          "roles.reference.gpus=1", "roles.actor.train.ppo_epochs=2"}),
      2, 2);
}

// Forwards by a token budget (verl's log_prob_use_dynamic_bsz, the critic's
// forward_max_token_len_per_gpu) wired from the job's settings, over ZeRO-3 actor and critic
// replicas. On the CPU the forwards pad their rows, so each row counts the padded width (38
// tokens) and 76 tokens make forwards of two rows; the old log-probs (two epochs make them run),
// reference log-probs and values equal one process's. Budgets in real tokens, rows packed out of
// order and replicas padding to agree are forward_passes_test's.
TEST_CASE("log-prob and value forwards packed by tokens under ZeRO-3 equal one process",
          "[roles]") {
  CheckAgainstOneProcess(
      TestSpec(kPpoJob,
               {"roles.actor.train.zero_stage=3", "roles.actor.train.ppo_epochs=2",
                "roles.actor.rollout.log_prob_use_dynamic_bsz=true",
                "roles.actor.rollout.log_prob_max_token_len_per_gpu=76",
                "roles.reference.log_prob_use_dynamic_bsz=true",
                "roles.reference.log_prob_max_token_len_per_gpu=76", "roles.critic.gpus=2",
                "roles.critic.train.zero_stage=3", "roles.critic.train.use_dynamic_bsz=true",
                "roles.critic.forward_max_token_len_per_gpu=76"}),
      4, 2);
}

// The actor's two ranks decode as one tensor-parallel group (each its half of every layer): the
// greedy responses are those of one engine over the whole model (tp_g 1), and so is the rest.
TEST_CASE(
    "the actor's rollout at tp_g 2 gives the responses of tp_g 1; the steps equal one process",
    "[roles][tp]") {
  SECTION("PPO split (greedy)") {
    CheckAgainstOneProcess(TestSpec(kPpoJob, {"roles.actor.rollout.tp=2", "trainer.device=cpu"}), 4,
                           2);
  }
  SECTION("GRPO colocated on two workers each hosting every role, n = 4 sampled") {
    CheckAgainstOneProcess(
        TestSpec(kGrpoJob, {"placement=colocated", "roles.reference.gpus=2", "roles.reward.gpus=2",
                            "roles.actor.rollout.tp=2", "trainer.device=cpu"}),
        2, 2);
  }
  SECTION("GRPO split, n = 4 sampled") {
    CheckAgainstOneProcess(TestSpec(kGrpoJob, {"roles.actor.rollout.tp=2", "trainer.device=cpu"}),
                           2, 2);
  }
}

// A LoRA actor (rank 4 on every linear layer, lr 1e-3): the rollout runs the merged weights, the
// update trains the adapters alone (the checkpoint holds only them) and the reference is the
// base: loaded on its own rank (split), or the actor's module with its adapters off on the
// actor's ranks (colocated). One process trains the same adapters with the engine functions and
// takes the reference log-probs from a base it loads apart; greedy PPO also holds the responses
// to one engine over its merged weights.
TEST_CASE("a LoRA actor's steps equal one process, split and colocated", "[roles][lora]") {
  const std::vector<std::string> lora = {"model.lora_rank=4", "model.lora_alpha=8",
                                         "roles.actor.train.lr=1.0e-3"};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), lora.begin(), lora.end());
    return more;
  };
  SECTION("GRPO split, weight sync verified") {
    CheckAgainstOneProcess(TestSpec(kGrpoJob, with({"trainer.verify_weight_sync=1"})), 2, 2);
  }
  SECTION("GRPO colocated: the reference is the actor's base") {
    CheckAgainstOneProcess(TestSpec(kGrpoJob, with({"placement=colocated", "roles.reference.gpus=2",
                                                    "roles.reward.gpus=2"})),
                           2, 2);
  }
  SECTION("PPO split (greedy), rollout tp 2: the slices are cut from the merged weights") {
    CheckAgainstOneProcess(TestSpec(kPpoJob, with({"roles.actor.rollout.tp=2", "trainer.device=cpu",
                                                   "trainer.verify_weight_sync=1"})),
                           4, 2);
  }
  SECTION("PPO split (greedy), ZeRO-3 asked for: the adapters train under ZeRO-2") {
    CheckAgainstOneProcess(TestSpec(kPpoJob, with({"roles.actor.train.zero_stage=3"})), 4, 2);
  }
}

// trainer.verify_weight_sync 1 checks every rollout's weights against the trained ones and
// reports their checksum, which (step_check) equals that of the weights after the update the
// rollout follows. Under ZeRO-3 each rank generates from a gathered copy of every rank's shards.
TEST_CASE("verify_weight_sync checks each rollout's weights; the steps equal one process",
          "[roles][weight_sync]") {
  SECTION("ZeRO-2, actor dp 2") {
    CheckAgainstOneProcess(TestSpec(kGrpoJob, {"trainer.verify_weight_sync=1"}), 2, 2);
  }
  SECTION("ZeRO-2, rollout tp 2") {
    CheckAgainstOneProcess(TestSpec(kPpoJob, {"roles.actor.rollout.tp=2", "trainer.device=cpu",
                                              "trainer.verify_weight_sync=1"}),
                           4, 2);
  }
}

// Runs four steps of `spec` (each given the next step's plan, for one_step_off) and checks each
// rollout: checked, with the checksum of the weights after the update it follows (one_step_off:
// the one before last); `each` checks more of each step's metrics.
void CheckRolloutChecksums(const v1::JobSpec& spec, const std::string& job_id,
                           const std::function<void(const controller::Metrics&)>& each = {}) {
  const int64_t lag = spec.trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF ? 2 : 1;
  Hosts hosts(spec);
  JobStages job(job_id, spec, hosts.services);
  REQUIRE(job.Start(4).ok());
  std::map<int64_t, double> rollout_checksum, weights_checksum;
  for (int64_t step = 1; step <= 4; ++step) {
    const controller::StepPlan plan{.step = step, .prompts = TestPrompts(2), .seed = 10u + step};
    const controller::StepPlan next{
        .step = step + 1, .prompts = TestPrompts(2), .seed = 11u + step};
    const absl::StatusOr<controller::Metrics> metrics = job.RunStep(plan, &next);
    INFO("step " << step << ": " << metrics.status());
    REQUIRE(metrics.ok());
    CHECK(metrics->at("actor/weight_sync_ok") == 1);
    if (each) each(*metrics);
    rollout_checksum[step] = metrics->at("actor/rollout_weights_checksum");
    weights_checksum[step] = metrics->at("actor/weights_checksum");
    CHECK(rollout_checksum[step] ==
          (step > lag ? weights_checksum[step - lag] : rollout_checksum[1]));
  }
  CHECK(rollout_checksum[4] != rollout_checksum[1]);
  job.End();
}

// Under ZeRO-3 at rollout tp 1 each actor rank generates from a whole copy resharded from every
// rank's shards (cast and bucketed: the reshard at layout (tp 1, dp 2)): each rollout's checksum
// is that of the weights after the update it follows (one_step_off: the one before last), every
// check passes, and the reshard's buffers stay within the default bucket.
TEST_CASE("verify_weight_sync under ZeRO-3: the resharded copy is the trained weights",
          "[roles][weight_sync][one_step_off]") {
  for (const char* mode : {"sync", "one_step_off"}) {
    INFO(mode);
    CheckRolloutChecksums(
        TestSpec(kGrpoJob, {"roles.actor.train.zero_stage=3", "trainer.verify_weight_sync=1",
                            absl::StrCat("trainer.mode=", mode)}),
        absl::StrCat("job-zero3-", mode), [](const controller::Metrics& metrics) {
          CHECK(metrics.at("perf/rollout_reshard_received_bytes") > 0);
          CHECK(metrics.at("perf/rollout_reshard_buffer_bytes") <= double{1 << 30});
        });
  }
}

// Rollout tp 2 over ZeRO-3 shards: each actor rank receives only its own slices, resharded from
// the shards that hold them (no rank gathers the model). With verify_weight_sync every step also
// gathers the weights, checks them against the shards, and holds the resharded slices to their
// slices bitwise; the greedy responses are those of the same job decoding at tp 1.
TEST_CASE("rollout tp 2 from ZeRO-3 shards: resharded slices equal the gathered weights' slices",
          "[roles][tp][weight_sync]") {
  const auto responses = [](const std::vector<std::string>& overrides) {
    TempDir dir;
    v1::JobSpec spec = TestSpec(kPpoJob, overrides);
    spec.mutable_trainer()->set_rollout_data_dir(dir.path() + "/dumps");
    Hosts hosts(spec);
    JobStages job("job-reshard", spec, hosts.services);
    REQUIRE(job.Start(3).ok());
    std::vector<at::Tensor> ids;
    for (int64_t step = 1; step <= 3; ++step) {
      const absl::StatusOr<controller::Metrics> metrics =
          job.RunStep({.step = step,
                       .prompts = TestPrompts(4),
                       .seed = 40u + step,
                       .kl_coef = testing::StepKlCoefficient(spec)});
      INFO("step " << step << ": " << metrics.status());
      REQUIRE(metrics.ok());
      // Resharded (tp 2): buffers within the default 1 GiB bucket, and slices received.
      if (spec.roles().actor().rollout().tp() == 2) {
        CHECK(metrics->at("perf/rollout_reshard_received_bytes") > 0);
        CHECK(metrics->at("perf/rollout_reshard_buffer_bytes") <= double{1 << 30});
      }
      ids.push_back(testing::Dumped(job, step).tensors.at("input_ids"));
    }
    job.End();
    return ids;
  };
  const std::vector<at::Tensor> resharded =
      responses({"roles.actor.train.zero_stage=3", "roles.actor.rollout.tp=2", "trainer.device=cpu",
                 "trainer.verify_weight_sync=1"});
  const std::vector<at::Tensor> unchecked = responses(
      {"roles.actor.train.zero_stage=3", "roles.actor.rollout.tp=2", "trainer.device=cpu"});
  const std::vector<at::Tensor> whole =
      responses({"roles.actor.train.zero_stage=3", "trainer.device=cpu"});
  for (size_t step = 0; step < whole.size(); ++step) {
    INFO("step " << step + 1);
    CHECK(at::equal(resharded[step], whole[step]));
    CHECK(at::equal(unchecked[step], whole[step]));
  }
}

// A byte flipped in one rank's resharded slice (as a faulty reshard would) fails the checked step
// on every rank, naming the rank and the tensor. The tensor is row-parallel, so its slices are
// copies received from other ranks, never views of the rank's own shard.
TEST_CASE("rollout tp 2 from ZeRO-3 shards: a corrupted resharded slice fails the step",
          "[roles][tp][weight_sync]") {
  const v1::JobSpec spec =
      TestSpec(kPpoJob, {"roles.actor.train.zero_stage=3", "roles.actor.rollout.tp=2",
                         "trainer.device=cpu", "trainer.verify_weight_sync=1"});
  const char* const kFlipped = "model.layers.0.self_attn.o_proj.weight";
  Hosts hosts(
      spec, [kFlipped](bool resharded, const std::map<std::string, at::Tensor>& weights, int rank) {
        if (rank != 1 || !resharded) return;
        const at::Tensor& tensor = weights.at(kFlipped);
        static_cast<uint8_t*>(tensor.data_ptr())[5] ^= 0x10;
      });
  JobStages job("job-reshard-flip", spec, hosts.services);
  REQUIRE(job.Start(1).ok());
  const absl::StatusOr<controller::Metrics> failed =
      job.RunStep({.step = 1,
                   .prompts = TestPrompts(4),
                   .seed = 3,
                   .kl_coef = testing::StepKlCoefficient(spec)});
  REQUIRE_FALSE(failed.ok());
  INFO(failed.status());
  CHECK(failed.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(failed.status().message()),
             Catch::Contains(absl::StrCat("actor rank 1's resharded slice of ", kFlipped)));
  job.End();
}

// trainer.mode one_step_off: step k's rollout is generated before step k - 1 trains, with the
// weights step k - 1 started from (the update before last): its checksum is theirs, and
// greedy responses are those of one engine over them. Every other stage and the updates equal
// one process running the same off-policy schedule.
TEST_CASE(
    "one_step_off: each rollout uses the weights of the update before last; the steps "
    "equal one process",
    "[roles][one_step_off]") {
  SECTION("PPO split, greedy, ZeRO-2") {
    CheckAgainstOneProcess(
        TestSpec(kPpoJob, {"trainer.mode=one_step_off", "trainer.verify_weight_sync=1"}), 4, 3);
  }
  SECTION("GRPO on two workers each hosting every role, sampled") {
    CheckAgainstOneProcess(
        TestSpec(kGrpoJob, {"placement=colocated", "roles.reference.gpus=2", "roles.reward.gpus=2",
                            "trainer.mode=one_step_off", "trainer.verify_weight_sync=1"}),
        2, 3);
  }
  SECTION("PPO split, greedy, ZeRO-3 resharded to a tp 2 rollout") {
    CheckAgainstOneProcess(
        TestSpec(kPpoJob, {"roles.actor.train.zero_stage=3", "roles.actor.rollout.tp=2",
                           "trainer.device=cpu", "trainer.mode=one_step_off",
                           "trainer.verify_weight_sync=1"}),
        4, 3);
  }
}

// trainer.mode async: the rollout pool generates the next batches on a thread of its own while
// the actor trains. Its decode steps are held (400 ms, 3.2 s a batch), so a batch outlasts a
// step's training and this test's one-process replay of it (about 1.5 s), and a weight update
// reaches the pool mid-batch: with partial rollouts it interrupts the batch,
// which goes on with the new weights. Every token's rollout log-prob is held to one process's
// under the weights that sampled it (step_check's CheckAsyncRollout), the staleness to
// trainer.max_staleness, and the intermediates and updates to one process's.
TEST_CASE(
    "async: the pool generates ahead; each token's weights are checked; the steps equal one "
    "process",
    "[roles][async]") {
  SECTION("GRPO, a pool of 2, partial rollouts, max_staleness 1") {
    const v1::JobSpec spec =
        TestSpec(kGrpoJob, {"roles.rollout.gpus=2", "trainer.mode=async",
                            "roles.rollout.partial_rollout=true", "trainer.verify_weight_sync=1",
                            "data.max_response_length=8"});
    Hosts hosts(spec, nullptr, absl::Milliseconds(400));
    testing::CheckAgainstOneProcess(spec, hosts.services, 2, 4);
  }
  SECTION("PPO (greedy), a pool of 1, whole batches, max_staleness 2") {
    const v1::JobSpec spec =
        TestSpec(kPpoJob, {"roles.rollout.gpus=1", "trainer.mode=async", "trainer.max_staleness=2",
                           "trainer.verify_weight_sync=1"});
    Hosts hosts(spec, nullptr, absl::Milliseconds(20));
    testing::CheckAgainstOneProcess(spec, hosts.services, 4, 4);
  }
}

// algorithm.rollout_correction at a sampling temperature of 0.7: the trainer's log-probs are
// those of softmax(logits / T), which the rollout sampled from (step_check compares the two on
// the weights that sampled), and the importance weights (token or sequence, batch-normalised),
// or the rollout's log-probs as the old ones (bypass), make the same updates as one process.
TEST_CASE("rollout correction and bypass mode at temperature 0.7 equal one process",
          "[roles][rollout_correction]") {
  SECTION("token weights, one step off") {
    CheckAgainstOneProcess(
        TestSpec(kGrpoJob, {"trainer.mode=one_step_off", "roles.actor.rollout.temperature=0.7",
                            "algorithm.rollout_correction.rollout_is=token"}),
        2, 3);
  }
  SECTION("sequence weights, batch-normalised, in sync") {
    CheckAgainstOneProcess(
        TestSpec(kGrpoJob, {"roles.actor.rollout.temperature=0.7",
                            "algorithm.rollout_correction.rollout_is=sequence",
                            "algorithm.rollout_correction.rollout_is_batch_normalize=true",
                            "algorithm.rollout_correction.rollout_is_threshold=1.5"}),
        2, 2);
  }
  SECTION("bypass mode, one step off") {
    CheckAgainstOneProcess(
        TestSpec(kGrpoJob, {"trainer.mode=one_step_off", "roles.actor.rollout.temperature=0.7",
                            "algorithm.rollout_correction.bypass_mode=true"}),
        2, 3);
  }
}

// A byte of one rank's rollout copy flipped after the update (as a faulty transfer would): the
// check fails the step on every rank before any generates, naming the tensor and the ranks.
// A faulty transfer, as the weights hooks make one: a bit of the tensor's third-last byte flipped.
void FlipAByte(const at::Tensor& tensor) {
  static_cast<uint8_t*>(tensor.data_ptr())[tensor.nbytes() - 3] ^= 0x04;
}

TEST_CASE("verify_weight_sync: a byte flipped in one rank's rollout weights fails the step",
          "[roles][weight_sync]") {
  const v1::JobSpec spec =
      TestSpec(kGrpoJob, {"roles.actor.train.zero_stage=3", "trainer.verify_weight_sync=2"});
  const char* const kFlipped = "model.layers.1.mlp.down_proj.weight";
  // Set for step 1 only.
  auto flip = std::make_shared<std::atomic<bool>>(true);
  Hosts hosts(spec,
              [flip, kFlipped](bool, const std::map<std::string, at::Tensor>& weights, int rank) {
                if (rank == 1 && flip->load()) FlipAByte(weights.at(kFlipped));
              });
  JobStages job("job-flip", spec, hosts.services);
  REQUIRE(job.Start(3).ok());
  // Step 1 is checked and fails; step 2 is not checked (every 2 steps) and runs on the copy the
  // next update rebuilds.
  const absl::StatusOr<controller::Metrics> failed =
      job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 1});
  REQUIRE_FALSE(failed.ok());
  INFO(failed.status());
  CHECK(failed.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(failed.status().message()),
             Catch::Contains("trainer.verify_weight_sync: step 1") &&
                 Catch::Contains(absl::StrCat(kFlipped, " in actor rank 1's rollout weights")) &&
                 Catch::Contains("trained crc32c"));
  flip->store(false);
  const absl::StatusOr<controller::Metrics> unchecked =
      job.RunStep({.step = 2, .prompts = TestPrompts(2), .seed = 2});
  INFO(unchecked.status());
  REQUIRE(unchecked.ok());
  CHECK(unchecked->count("actor/weight_sync_ok") == 0);
  job.End();
}

// A rollout pool of its own (roles.rollout): the actor's ranks send their parts of the weights
// straight to the rollout ranks, which generate; the rows move to the actor's ranks. The steps
// equal one process (greedy responses those of one engine over the trained weights), in both
// modes and both training layouts, each rollout checked against what the actor ranks sent.
TEST_CASE("a rollout pool of its own: the steps equal one process, every rollout checked",
          "[roles][rollout_pool][weight_sync]") {
  SECTION("PPO split, greedy, ZeRO-2, rollout pool of 2") {
    CheckAgainstOneProcess(
        TestSpec(kPpoJob, {"roles.rollout.gpus=2", "trainer.verify_weight_sync=1",
                           "roles.actor.train.zero_stage=2"}),
        4, 2);
  }
  SECTION("GRPO, ZeRO-3 shards to one rollout rank, one_step_off") {
    CheckAgainstOneProcess(TestSpec(kGrpoJob, {"roles.rollout.gpus=1", "trainer.mode=one_step_off",
                                               "trainer.verify_weight_sync=1"}),
                           2, 3);
  }
  SECTION("PPO split, greedy, ZeRO-3 shards to a rollout pool of 2 at tp 2") {
    CheckAgainstOneProcess(
        TestSpec(kPpoJob, {"roles.rollout.gpus=2", "roles.actor.rollout.tp=2", "trainer.device=cpu",
                           "trainer.verify_weight_sync=1"}),
        4, 2);
  }
  SECTION("PPO colocated on one worker, rollout pool of 1, one_step_off") {
    CheckAgainstOneProcess(
        TestSpec(kPpoJob, {"placement=colocated", "roles.actor.gpus=1", "roles.rollout.gpus=1",
                           "trainer.mode=one_step_off", "trainer.verify_weight_sync=1"}),
        4, 3);
  }
}

// Each rollout's checksum over the weights the rollout ranks received is that of the weights
// after the update it follows (one_step_off: the one before last), as the actor ranks computed
// it from their own parts, at rollout tp 1 (whole weights) and tp 2 (slices). The transfer's
// buffers stay within the configured bucket (1 MiB; the fixture's weights are smaller, so the
// bound itself, with weights many buckets large, is parallel_test's reshard_pools).
TEST_CASE("a rollout pool's weights are the trained weights after the update they follow",
          "[roles][rollout_pool][weight_sync][one_step_off]") {
  for (const char* mode : {"sync", "one_step_off"}) {
    for (const char* zero : {"2", "3"}) {
      for (const char* tp : {"1", "2"}) {
        INFO(mode << ", ZeRO-" << zero << ", rollout tp " << tp);
        const v1::JobSpec spec = TestSpec(
            kGrpoJob, {"roles.rollout.gpus=2", absl::StrCat("roles.actor.train.zero_stage=", zero),
                       "trainer.verify_weight_sync=1", absl::StrCat("trainer.mode=", mode),
                       "roles.actor.rollout.update_weights_bucket_megabytes=1",
                       absl::StrCat("roles.actor.rollout.tp=", tp), "trainer.device=cpu"});
        CheckRolloutChecksums(spec, absl::StrCat("job-pool-", mode, zero, tp),
                              [](const controller::Metrics& metrics) {
                                CHECK(metrics.at("perf/rollout_reshard_received_bytes") > 0);
                                CHECK(metrics.at("perf/rollout_reshard_buffer_bytes") <= (1 << 20));
                                CHECK(metrics.at("timing_s/update_weights") > 0);
                              });
      }
    }
  }
}

TEST_CASE("a byte flipped in a rollout rank's received weights fails the step, naming it",
          "[roles][rollout_pool][weight_sync]") {
  const v1::JobSpec spec =
      TestSpec(kGrpoJob, {"roles.rollout.gpus=2", "trainer.verify_weight_sync=1"});
  const char* const kFlipped = "model.layers.1.mlp.down_proj.weight";
  Hosts hosts(spec, [kFlipped](bool, const std::map<std::string, at::Tensor>& weights, int rank) {
    if (rank == 1) FlipAByte(weights.at(kFlipped));
  });
  JobStages job("job-pool-flip", spec, hosts.services);
  REQUIRE(job.Start(1).ok());
  const absl::StatusOr<controller::Metrics> failed =
      job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 1});
  REQUIRE_FALSE(failed.ok());
  INFO(failed.status());
  CHECK(failed.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(failed.status().message()),
             Catch::Contains("trainer.verify_weight_sync: step 1") &&
                 Catch::Contains(absl::StrCat("rollout rank 1's copy of ", kFlipped)) &&
                 Catch::Contains("sent crc32c"));
  job.End();
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
  key.set_attempt(1);  // JobStages' default
  return key;
}

TEST_CASE("a repeated stage call returns the stored reply and changes no weight", "[roles]") {
  at::set_num_threads(1);
  TempDir dir;
  const v1::JobSpec spec =
      TestSpec(kGrpoJob, {"placement=colocated", "roles.actor.gpus=1", "roles.reward.gpus=1",
                          "roles.reference.gpus=1", "trainer.checkpoint_dir=" + dir.path()});
  Hosts hosts(spec);
  JobStages job("job-repeat", spec, hosts.services);
  REQUIRE(job.Start(2).ok());
  REQUIRE(job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 5}).ok());
  REQUIRE(job.SaveCheckpoint(1, false).ok());
  v1::UpdateRequest update;
  *update.mutable_key() = Key("job-repeat", 1, "update_actor");
  update.set_optimizer_steps_before(0);
  auto again = Call(*hosts.hosts[0], &StageService::UpdateActor, update);
  REQUIRE(again.ok());
  CHECK(again->optimizer_steps() == 1);
  // The same key after the fact: same reply; the weights as saved after the first.
  REQUIRE(job.SaveCheckpoint(2, false).ok());
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

TEST_CASE("a checkpoint's actor export loads in transformers with the checkpoint's weights",
          "[roles]") {
  TempDir dir;
  const v1::JobSpec spec =
      TestSpec(kGrpoJob, {"placement=colocated", "roles.actor.gpus=1", "roles.reward.gpus=1",
                          "roles.reference.gpus=1", "trainer.checkpoint_dir=" + dir.path()});
  Hosts hosts(spec);
  JobStages job("job-export", spec, hosts.services);
  REQUIRE(job.Start(1).ok());
  REQUIRE(job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 9}).ok());
  REQUIRE(job.SaveCheckpoint(1, /*export_huggingface=*/true).ok());
  const rlhfd::testing::CommandResult checked = rlhfd::testing::RunCommand(
      {RLHFD_PYTHON, RLHFD_CHECK_EXPORT, dir.path() + "/step_1/actor/huggingface",
       dir.path() + "/step_1/actor/rank_0/state.safetensors"},
      absl::Seconds(120));
  INFO(checked.out << checked.err);
  CHECK(checked.exit_code == 0);
  job.End();
}

TEST_CASE("bad stage input gets a clear error naming what to fix", "[roles]") {
  at::set_num_threads(1);
  const v1::JobSpec spec = TestSpec(kGrpoJob, {"placement=colocated", "roles.actor.gpus=1",
                                               "roles.reward.gpus=1", "roles.reference.gpus=1"});
  Hosts hosts(spec);
  RoleHost& host = *hosts.hosts[0];
  const auto message = [](const absl::Status& status) { return std::string(status.message()); };

  SECTION("an unknown job") {
    v1::ForwardRequest forward;
    *forward.mutable_key() = Key("job-nope", 1, "values");
    auto reply = Call(host, &StageService::Forward, forward);
    CHECK(reply.status().code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(message(reply.status()), Catch::Contains("job-nope is not running"));
  }
  SECTION("calls naming jobs not hosted here, and starts that fail, leave no bookkeeping") {
    // Late calls for ended or deleted jobs name ids the host will never Forget: each such call
    // once left a pool-call count (or a cancel flag) behind for good.
    const size_t before = host.CallBookkeepingEntries();
    for (int i = 0; i < 20; ++i) {
      const std::string id = absl::StrCat("job-gone-", i);
      v1::GenerateRequest generate;
      *generate.mutable_key() = Key(id, 1, "generate");
      CHECK(Call(host, &StageService::Generate, generate).status().code() ==
            absl::StatusCode::kUnavailable);
      v1::SyncWeightsRequest sync;
      *sync.mutable_key() = Key(id, 1, "sync");
      CHECK(Call(host, &StageService::SyncWeights, sync).status().code() ==
            absl::StatusCode::kUnavailable);
      v1::MoveTensorsRequest move;
      *move.mutable_key() = Key(id, 1, "move");
      move.set_from_role(v1::ROLE_ROLLOUT);
      CHECK(Call(host, &StageService::MoveTensors, move).status().code() ==
            absl::StatusCode::kUnavailable);
      v1::StartJobRequest start;  // No attempt: refused.
      start.set_job_id(absl::StrCat("job-unstarted-", i));
      CHECK(Call(host, &StageService::StartJob, start).status().code() ==
            absl::StatusCode::kInvalidArgument);
    }
    v1::JobSpec broken = spec;
    broken.mutable_model()->set_path("/nonexistent/model");
    v1::StartJobRequest start;
    start.set_job_id("job-unloadable");
    start.set_attempt(1);
    start.set_world_size(1);
    *start.mutable_spec() = broken;
    CHECK_FALSE(Call(host, &StageService::StartJob, start).ok());
    CHECK(host.CallBookkeepingEntries() == before);
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
        absl::StrCat("http://127.0.0.1:", rlhfd::testing::FreeLoopbackPort(), "/score");
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
    for (const v1::PromptRow& row : TestPrompts(2)) *generate.add_prompts() = row;
    generate.set_total_prompts(2);
    REQUIRE(Call(host, &StageService::Generate, generate).ok());
    auto no_scores = Call(host, &StageService::ComputeAdvantages, advantages);
    CHECK_THAT(message(no_scores.status()),
               Catch::Contains("needs scores") && Catch::Contains("rewards"));

    v1::MoveTensorsRequest move;
    *move.mutable_key() = Key("job-order", 1, "move");
    move.add_tensors("input_ids");
    move.set_from_role(v1::ROLE_ACTOR);
    move.set_to_role(v1::ROLE_REFERENCE);
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

// What a caller holding the worker's stage token still cannot do: reach an attempt it does not
// name, or make the worker write, read or probe a directory other than the job's own.
TEST_CASE("stage calls are fenced by attempt and confined to the job's directories", "[roles]") {
  at::set_num_threads(1);
  TempDir dir;
  const std::string checkpoints = dir.path() + "/checkpoints";
  const std::string elsewhere = dir.path() + "/elsewhere";
  const v1::JobSpec spec =
      TestSpec(kGrpoJob, {"placement=colocated", "roles.actor.gpus=1", "roles.reward.gpus=1",
                          "roles.reference.gpus=1", "trainer.checkpoint_dir=" + checkpoints,
                          "trainer.rollout_data_dir=" + dir.path() + "/dumps"});
  Hosts hosts(spec);
  RoleHost& host = *hosts.hosts[0];
  JobStages job("job-fenced", spec, hosts.services, {.attempt = 3});
  REQUIRE(job.Start(2).ok());
  REQUIRE(job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 5}).ok());
  REQUIRE(job.SaveCheckpoint(1, false).ok());
  const auto message = [](const absl::Status& status) { return std::string(status.message()); };

  SECTION("attempt 0 and another attempt are refused, for every kind of call") {
    for (const int64_t attempt : {0, 2, 4}) {
      INFO("attempt " << attempt);
      v1::GenerateRequest generate;
      *generate.mutable_key() = Key("job-fenced", 2, "generate");
      generate.mutable_key()->set_attempt(attempt);
      auto generated = Call(host, &StageService::Generate, generate);
      REQUIRE_FALSE(generated.ok());
      CHECK_THAT(message(generated.status()),
                 Catch::Contains(attempt == 0 ? "must name its job's attempt" : "runs attempt 3"));
      v1::CheckpointRequest load;
      *load.mutable_key() = Key("job-fenced", 1, "load");
      load.mutable_key()->set_attempt(attempt);
      load.set_directory(checkpoints);
      CHECK_FALSE(Call(host, &StageService::LoadCheckpoint, load).ok());
    }
    v1::PrepareJobRequest prepare;
    prepare.set_job_id("job-other");
    CHECK(Call(host, &StageService::PrepareJob, prepare).status().code() ==
          absl::StatusCode::kInvalidArgument);
    v1::StartJobRequest start;
    start.set_job_id("job-fenced");
    *start.mutable_spec() = spec;
    CHECK(Call(host, &StageService::StartJob, start).status().code() ==
          absl::StatusCode::kInvalidArgument);
    v1::EndJobRequest end;
    end.set_job_id("job-fenced");
    CHECK(Call(host, &StageService::EndJob, end).status().code() ==
          absl::StatusCode::kInvalidArgument);
    // None of those touched the running attempt: it steps on.
    CHECK(job.RunStep({.step = 2, .prompts = TestPrompts(2), .seed = 6}).ok());
  }
  SECTION("a directory other than trainer.checkpoint_dir or rollout_data_dir is refused") {
    for (const std::string& directory :
         std::vector<std::string>{elsewhere, "/", checkpoints + "/../elsewhere",
                                  checkpoints + "/step_1", "checkpoints", ""}) {
      INFO("directory '" << directory << "'");
      v1::CheckpointRequest save;
      *save.mutable_key() = Key("job-fenced", 1, "save elsewhere");
      save.mutable_key()->set_attempt(3);
      save.set_directory(directory);
      save.set_step(7);
      auto saved = Call(host, &StageService::SaveCheckpoint, save);
      CHECK(saved.status().code() == absl::StatusCode::kPermissionDenied);
      CHECK_THAT(message(saved.status()), Catch::Contains("trainer.checkpoint_dir"));
      *save.mutable_key() = Key("job-fenced", 1, "commit elsewhere");
      save.mutable_key()->set_attempt(3);
      CHECK(Call(host, &StageService::CommitCheckpoint, save).status().code() ==
            absl::StatusCode::kPermissionDenied);
      v1::CheckpointRequest load = save;
      *load.mutable_key() = Key("job-fenced", 1, "load");
      load.mutable_key()->set_attempt(3);
      CHECK(Call(host, &StageService::LoadCheckpoint, load).status().code() ==
            absl::StatusCode::kPermissionDenied);
      v1::DumpBatchRequest dump;
      *dump.mutable_key() = Key("job-fenced", 1, "dump elsewhere");
      dump.mutable_key()->set_attempt(3);
      dump.set_directory(directory);
      auto dumped = Call(host, &StageService::DumpBatch, dump);
      CHECK(dumped.status().code() == absl::StatusCode::kPermissionDenied);
      CHECK_THAT(message(dumped.status()), Catch::Contains("trainer.rollout_data_dir"));
    }
    CHECK_FALSE(PathExists(elsewhere));
    CHECK_FALSE(PathExists(checkpoints + "/step_7"));
    CHECK_FALSE(PathExists(dir.path() + "/step_7"));
    // The job's own directory, spelt with a trailing slash and a "." part, is its own.
    v1::CheckpointRequest load;
    *load.mutable_key() = Key("job-fenced", 1, "load");
    load.mutable_key()->set_attempt(3);
    load.set_directory(checkpoints + "/./");
    auto loaded = Call(host, &StageService::LoadCheckpoint, load);
    INFO(loaded.status());
    CHECK(loaded.ok());
  }
  job.End();
}

}  // namespace
}  // namespace rlhfd::roles

// Config loading: every example in configs/ loads, defaults apply, and each class of error
// (syntax, unknown key, wrong type, out of range, bad enum, inconsistent sections) is refused
// with the file, the key path and a fix.
#include <catch2/catch.hpp>
#include <string>

#include "common/algorithms/supervised.h"
#include "common/config/config_errors.h"
#include "common/config/config_printer.h"
#include "common/config/job_config.h"
#include "common/config/job_defaults.h"
#include "common/config/job_validator.h"
#include "common/config/proto_json_schema.h"
#include "common/util/files.h"

namespace rlhfd::config {
namespace {

// A valid GRPO config; tests add or override one key to break it.
constexpr char kValidYaml[] = R"(
name: unit-test-job
model: {path: /models/tiny}
data: {train_files: [train.jsonl], train_batch_size: 16}
algorithm: {adv_estimator: grpo, kl: {mode: loss}}
roles:
  actor:
    gpus: 2
    train: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 4}
    rollout: {n: 4}
  reference: {}
  reward: {rule: gsm8k}
)";

std::string ErrorOf(const std::string& text, const std::string& source = "job.yaml") {
  auto spec = ParseJobSpec(text, source);
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

std::string With(const std::string& extra) { return std::string(kValidYaml) + extra; }

// `text` with the first `from` replaced by `to`; `from` must occur.
std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("every example config in configs/ loads and validates", "[config]") {
  int loaded = 0;
  auto names = ListDirectory(RLHFD_CONFIGS_DIR);
  REQUIRE(names.ok());
  for (const std::string& name : *names) {
    // configs/verl/ holds verl's own trainer config (convert-verl's defaults), configs/tools/
    // tool configs (tool_config_test reads them): not jobs.
    if (name == "verl" || name == "tools") continue;
    const std::string path = std::string(RLHFD_CONFIGS_DIR) + "/" + name;
    INFO(path);
    auto spec = LoadJobSpecFile(path);
    REQUIRE(spec.ok());
    CHECK_FALSE(spec->name().empty());
    CHECK(spec->roles().actor().train().dp() >= 1);
    ++loaded;
  }
  CHECK(loaded >= 4);
}

TEST_CASE("defaults fill what the config leaves out and keep what it says", "[config]") {
  auto spec = ParseJobSpec(With("trainer: {seed: 0}\n"), "job.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->model().dtype() == v1::DTYPE_BF16);
  CHECK(spec->data().max_prompt_length() == 512);
  CHECK(spec->data().shuffle());
  CHECK(spec->algorithm().kl().mode() == v1::KL_MODE_LOSS);
  CHECK(spec->algorithm().kl().estimator() == v1::KL_ESTIMATOR_K3);
  CHECK(spec->algorithm().clip_ratio_high() == Approx(0.2));
  CHECK(spec->roles().actor().train().lr() == Approx(1e-6));
  CHECK(spec->roles().actor().rollout().top_p() == Approx(1.0));
  CHECK(spec->placement() == v1::PLACEMENT_SPLIT);
  CHECK(spec->trainer().loggers_size() == 1);
  // Derived: dp = gpus / tp; reference GPUs = 1 under split placement.
  CHECK(spec->roles().actor().train().dp() == 2);
  CHECK(spec->roles().reference().gpus() == 1);
  // A value written as 0 stays 0 (seed's default is 1).
  CHECK(spec->trainer().seed() == 0);
  CHECK(TotalGpus(*spec) == 3);
}

TEST_CASE("JSON and YAML of the same job give the same spec", "[config]") {
  const std::string json = R"({"name": "unit-test-job", "model": {"path": "/models/tiny"},
    "data": {"train_files": ["train.jsonl"], "train_batch_size": 16},
    "algorithm": {"adv_estimator": "grpo", "kl": {"mode": "loss"}},
    "roles": {"actor": {"gpus": 2, "train": {"ppo_mini_batch_size": 8,
              "ppo_micro_batch_size_per_gpu": 4}, "rollout": {"n": 4}},
              "reference": {}, "reward": {"rule": "gsm8k"}}})";
  auto from_json = ParseJobSpec(json, "job.json");
  auto from_yaml = ParseJobSpec(kValidYaml, "job.yaml");
  REQUIRE(from_json.ok());
  REQUIRE(from_yaml.ok());
  CHECK(from_json->SerializeAsString() == from_yaml->SerializeAsString());
}

TEST_CASE("enum names: short, hyphenated, aliased and full forms", "[config]") {
  auto spec = ParseJobSpec(With("placement: colocated\n"), "job.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->placement() == v1::PLACEMENT_COLOCATED);
  // Colocated: the reference shares the actor's GPUs.
  CHECK(spec->roles().reference().gpus() == 2);

  const std::string yaml = R"(
name: enums
model: {path: /m, dtype: bfloat16}
data: {train_files: a.jsonl, train_batch_size: 4}
algorithm: {adv_estimator: REINFORCE_PLUS_PLUS, loss_agg_mode: seq-mean-token-sum-norm, kl: {mode: none}}
roles: {actor: {train: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 4}}, reward: {remote: "http://rm:8000/score"}}
)";
  auto enums = ParseJobSpec(yaml, "enums.yaml");
  REQUIRE(enums.ok());
  CHECK(enums->model().dtype() == v1::DTYPE_BF16);
  CHECK(enums->algorithm().adv_estimator() == v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS);
  CHECK(enums->algorithm().loss_agg_mode() == v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM);
  // A single file where a list is expected is a list of one.
  REQUIRE(enums->data().train_files_size() == 1);
  CHECK(enums->data().train_files(0) == "a.jsonl");
}

TEST_CASE("syntax errors name the file and position", "[config][errors]") {
  CHECK_THAT(ErrorOf("name: [unclosed\n"), Catch::Contains("job.yaml: invalid YAML at line"));
  CHECK_THAT(ErrorOf("{\"name\": \"x\",,}", "job.json"),
             Catch::Contains("job.json: invalid JSON at byte"));
  CHECK_THAT(ErrorOf("- a\n- b\n"), Catch::Contains("top level must be a mapping"));
  CHECK_THAT(ErrorOf("name: a\nname: b\n"), Catch::Contains("key 'name' appears twice"));
}

TEST_CASE("unknown keys are named with their path and a suggestion", "[config][errors]") {
  const std::string error = ErrorOf(R"(
name: x
model: {path: /m}
roles: {actor: {train: {lrr: 0.1}}}
)");
  CHECK_THAT(error, Catch::Contains("job.yaml: roles.actor.train.lrr: unknown key; did you mean 'lr'?"));
  CHECK_THAT(ErrorOf(With("trainer_config: {}\n")),
             Catch::Contains("trainer_config: unknown key; did you mean 'trainer'?"));
}

TEST_CASE("wrong types are named with the value found", "[config][errors]") {
  CHECK_THAT(ErrorOf(With("trainer: {total_steps: many}\n")),
             Catch::Contains("trainer.total_steps: expected a whole number, got \"many\""));
  CHECK_THAT(ErrorOf(With("trainer: {resume: sometimes}\n")),
             Catch::Contains("trainer.resume: expected true or false"));
  CHECK_THAT(ErrorOf(With("data_: 1\n")), Catch::Contains("did you mean 'data'?"));
  CHECK_THAT(ErrorOf(R"(name: x
model: /models/tiny
)"),
             Catch::Contains("model: expected a mapping of keys"));
  CHECK_THAT(ErrorOf(With("trainer: {total_steps: 1.5}\n")),
             Catch::Contains("expected a whole number, got \"1.5\""));
  CHECK_THAT(ErrorOf(With("trainer: {save_every: 99999999999}\n")),
             Catch::Contains("trainer.save_every: 99999999999 is out of range"));
  CHECK_THAT(ErrorOf(With("trainer: {seed: }\n")), Catch::Contains("trainer.seed: has no value"));
}

TEST_CASE("bad enum values list the valid names", "[config][errors]") {
  CHECK_THAT(ErrorOf(With("placement: scattered\n")),
             Catch::Contains("placement: \"scattered\" is not one of: split, colocated"));
  const std::string error = ErrorOf(R"(
name: x
algorithm: {adv_estimator: ppo}
)");
  CHECK_THAT(error, Catch::Contains("algorithm.adv_estimator: \"ppo\" is not one of: gae, grpo"));
  CHECK_THAT(ErrorOf(With("trainer: {mode: fully_async}\n")),
             Catch::Contains("trainer.mode: \"fully_async\" is not one of: sync, one_step_off, "
                             "async, sft"));
}

TEST_CASE("trainer.mode sft: what a supervised job needs and what it refuses", "[config]") {
  const char kSft[] = R"(name: sft
model: {path: /models/tiny}
data: {train_files: [/data/chats.jsonl], train_batch_size: 256}
roles:
  actor: {gpus: 2}
trainer: {mode: sft}
)";
  // No reward, critic, reference or estimator: the default estimator (gae) is dropped.
  auto spec = ParseJobSpec(kSft, "x.yaml");
  INFO(spec.status());
  REQUIRE(spec.ok());
  CHECK(spec->trainer().mode() == v1::TRAINER_MODE_SFT);
  CHECK(spec->data().messages_key() == "messages");
  CHECK(spec->algorithm().adv_estimator() == v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED);
  const std::string sft = kSft;
  const auto with_actor = [&](const std::string& actor) {
    return Replace(sft, "actor: {gpus: 2}", "actor: {gpus: 2, " + actor + "}");
  };
  // Validation without a reward is by the loss on conversations (verl's SFT trainer's); with one,
  // it generates and scores.
  const std::string validated =
      Replace(sft, "train_batch_size: 256", "train_batch_size: 256, val_files: [/data/test.jsonl]");
  auto by_loss = ParseJobSpec(validated, "x.yaml");
  INFO(by_loss.status());
  REQUIRE(by_loss.ok());
  CHECK(algorithms::ValidatesByLoss(*by_loss));
  auto scored = ParseJobSpec(
      Replace(validated, "actor: {gpus: 2}", "actor: {gpus: 2}\n  reward: {rule: gsm8k}"),
      "x.yaml");
  INFO(scored.status());
  REQUIRE(scored.ok());
  CHECK_FALSE(algorithms::ValidatesByLoss(*scored));
  CHECK_FALSE(algorithms::ValidatesByLoss(*ParseJobSpec(kValidYaml, "x.yaml")));  // an RL job
  CHECK_THAT(ErrorOf(with_actor("rollout: {n: 4}")),
             Catch::Contains("roles.actor.rollout.n: 4: a supervised step trains one row per "
                             "conversation"));
  CHECK_THAT(ErrorOf(with_actor("rollout: {tp: 2}")),
             Catch::Contains("roles.actor.rollout.tp: 2: supervised steps lay their rows out at "
                             "rollout tp 1"));
  CHECK_THAT(ErrorOf(sft + "algorithm: {entropy_coeff: 0.01}\n"),
             Catch::Contains("algorithm.entropy_coeff: a supervised step has no entropy bonus"));
  CHECK_THAT(ErrorOf(sft + "algorithm: {rollout_correction: {rollout_is: token}}\n"),
             Catch::Contains("algorithm.rollout_correction: corrects for a rollout's policy"));
  CHECK_THAT(
      ErrorOf(Replace(sft, "actor: {gpus: 2}", "actor: {gpus: 2}\n  reward: {model: /models/rm}")),
      Catch::Contains("roles.reward.model: a reward model pool is not run by supervised "
                      "steps"));
  CHECK_THAT(
      ErrorOf(Replace(sft, "trainer: {mode: sft}", "trainer: {mode: sft, critic_warmup: 2}")),
      Catch::Contains("trainer.critic_warmup: is unused; remove it (trainer.mode sft"));
  CHECK_THAT(ErrorOf(Replace(sft, "actor: {gpus: 2}", "actor: {gpus: 2}\n  critic: {}")),
             Catch::Contains("roles.critic: is unused; remove it (trainer.mode sft"));
  CHECK_THAT(ErrorOf(sft + "algorithm: {kl: {mode: loss}}\n"),
             Catch::Contains("algorithm.kl.mode: a supervised step has no KL term"));
  CHECK_THAT(ErrorOf(Replace(sft, "actor: {gpus: 2}", "actor: {gpus: 2}\n  rollout: {}")),
             Catch::Contains("roles.rollout: a rollout pool generates for RL steps"));
  CHECK_THAT(
      ErrorOf(Replace(sft, "train_batch_size: 256", "train_batch_size: 256, messages_key: ''")),
      Catch::Contains("data.messages_key: '': trainer.mode sft needs the key"));
  CHECK_THAT(
      ErrorOf(Replace(sft, "train_batch_size: 256", "train_batch_size: 256, messages_key: a..b")),
      Catch::Contains("data.messages_key: 'a..b'"));
  CHECK_THAT(ErrorOf(Replace(sft, "train_batch_size: 256", "train_batch_size: 256, tools_key: .t")),
             Catch::Contains("data.tools_key: '.t'"));
  // Single-turn rows: the response's key (verl's SFTDataset); messages_key is not read then.
  auto single = ParseJobSpec(Replace(sft, "train_batch_size: 256",
                                     "train_batch_size: 256, messages_key: '', "
                                     "prompt_key: extra_info.question, "
                                     "response_key: extra_info.answer"),
                             "x.yaml");
  INFO(single.status());
  REQUIRE(single.ok());
  CHECK(single->data().response_key() == "extra_info.answer");
  CHECK_THAT(
      ErrorOf(Replace(sft, "train_batch_size: 256", "train_batch_size: 256, response_key: a.")),
      Catch::Contains("data.response_key: 'a.'"));
  CHECK_THAT(ErrorOf(Replace(Replace(sft, "trainer: {mode: sft}", "trainer: {mode: sync}"),
                             "train_batch_size: 256", "train_batch_size: 256, response_key: r")),
             Catch::Contains("data.response_key: only trainer.mode sft reads responses"));
  // Its printed config (the unused estimator left out) reads back as the same job.
  auto again = ParseJobSpec(ToYaml(SpecToDocument(*spec), [](const std::string&) { return ""; }),
                            "printed.yaml");
  INFO(again.status());
  REQUIRE(again.ok());
  CHECK(again->SerializeAsString() == spec->SerializeAsString());
}

TEST_CASE("trainer.mode, verify_weight_sync and the rollout correction: values and refusals",
          "[config]") {
  const std::string yaml = kValidYaml;
  const auto correction = [&](const std::string& keys) {
    return Replace(yaml, "adv_estimator: grpo,",
                   "adv_estimator: grpo, rollout_correction: {" + keys + "},");
  };
  auto spec = ParseJobSpec(
      correction("rollout_is: null") + "trainer: {mode: one_step_off, verify_weight_sync: 5}\n",
      "x.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF);
  CHECK(spec->trainer().verify_weight_sync() == 5);
  CHECK(spec->algorithm().rollout_correction().rollout_is().empty());
  CHECK(spec->algorithm().rollout_correction().rollout_is_threshold() == 2.0);  // verl's default
  CHECK_THAT(ErrorOf(With("trainer: {verify_weight_sync: -1}\n")),
             Catch::Contains("trainer.verify_weight_sync: -1 must be in [0, "));
  CHECK_THAT(ErrorOf(correction("rollout_is: tok")),
             Catch::Contains("algorithm.rollout_correction.rollout_is: 'tok' is not token, "
                             "sequence or null (off)"));
  CHECK_THAT(ErrorOf(correction("rollout_is_threshold: 0")),
             Catch::Contains("algorithm.rollout_correction.rollout_is_threshold: 0 must be > 0"));
}

TEST_CASE("roles.rollout: its default, the GPUs it adds, and what it refuses", "[config]") {
  const std::string yaml = kValidYaml;
  const auto pool = [&](const std::string& keys, const std::string& rollout = "n: 4") {
    return Replace(Replace(yaml, "rollout: {n: 4}", "rollout: {" + rollout + "}"), "reference: {}",
                   "reference: {}\n  rollout: {" + keys + "}");
  };
  auto spec = ParseJobSpec(pool(""), "x.yaml");
  INFO(spec.status());
  REQUIRE(spec.ok());
  CHECK(spec->roles().has_rollout());
  CHECK(spec->roles().rollout().gpus() == 1);
  CHECK(TotalGpus(*spec) == 2 + 1 + 1);  // actor, reference, rollout pool
  auto colocated = ParseJobSpec(pool("gpus: 4") + "placement: colocated\n", "x.yaml");
  REQUIRE(colocated.ok());
  CHECK(TotalGpus(*colocated) == 2 + 4);
  CHECK_FALSE(ParseJobSpec(yaml, "x.yaml")->roles().has_rollout());
  CHECK_THAT(ErrorOf(pool("gpus: 3")),
             Catch::Contains("roles.rollout.gpus: 3 does not divide data.train_batch_size (16)"));
  CHECK(ParseJobSpec(pool("gpus: 4", "n: 4, tp: 2"), "x.yaml").ok());
  CHECK_THAT(ErrorOf(pool("gpus: 1", "n: 4, tp: 2")),
             Catch::Contains("roles.rollout.gpus: 1 is not a multiple of roles.actor.rollout.tp "
                             "(2)"));
  CHECK_THAT(ErrorOf(pool("", "n: 4, multi_turn: {enable: true, tool_config_path: t.yaml}")),
             Catch::Contains("roles.rollout: multi-turn rollouts run on the actor's ranks"));
  CHECK_THAT(ErrorOf(Replace(pool(""), "adv_estimator: grpo", "adv_estimator: remax")),
             Catch::Contains("roles.rollout: remax's greedy baseline"));
  CHECK_THAT(ErrorOf(Replace(pool(""), "path: /models/tiny", "path: /models/tiny, lora_rank: 8")),
             Catch::Contains("roles.rollout: a LoRA actor's rollout runs on the actor's ranks"));
  // trainer.mode async: the pool keeps generating, within max_staleness (1 by default), and
  // partial rollouts go with it.
  auto async = ParseJobSpec(pool("partial_rollout: true") + "trainer: {mode: async}\n", "x.yaml");
  INFO(async.status());
  REQUIRE(async.ok());
  CHECK(async->trainer().mode() == v1::TRAINER_MODE_ASYNC);
  CHECK(async->trainer().max_staleness() == 1);
  CHECK(async->roles().rollout().partial_rollout());
  CHECK_FALSE(spec->roles().rollout().partial_rollout());
  CHECK_THAT(ErrorOf(yaml + "trainer: {mode: async}\n"),
             Catch::Contains("trainer.mode: async needs a rollout pool of its own"));
  CHECK_THAT(ErrorOf(pool("") + "trainer: {mode: async, max_staleness: 5}\n"),
             Catch::Contains("trainer.max_staleness"));
  CHECK_THAT(ErrorOf(pool("partial_rollout: true")),
             Catch::Contains("roles.rollout.partial_rollout: interrupts generation for a weight "
                             "update, which only trainer.mode async"));
  CHECK_THAT(
      ErrorOf(pool("gpus: 2, partial_rollout: true", "n: 4, tp: 2") + "trainer: {mode: async}\n"),
      Catch::Contains("roles.rollout.partial_rollout: runs at roles.actor.rollout.tp 1"));
}

TEST_CASE("multi_turn: verl's defaults, and what it needs", "[config]") {
  const std::string yaml = kValidYaml;
  const auto turns = [&](const std::string& keys) {
    return Replace(yaml, "rollout: {n: 4}", "rollout: {n: 4, multi_turn: {" + keys + "}}");
  };
  auto spec = ParseJobSpec(turns("enable: true, tool_config_path: /cfg/tools.yaml"), "x.yaml");
  REQUIRE(spec.ok());
  const v1::MultiTurnSpec& on = spec->roles().actor().rollout().multi_turn();
  CHECK(on.format() == "hermes");
  CHECK(on.max_parallel_calls() == 1);
  CHECK(on.max_tool_response_length() == 256);
  CHECK(on.tool_response_truncate_side() == "middle");
  CHECK(on.max_assistant_turns() == 0);
  CHECK_THAT(ErrorOf(turns("enable: true")),
             Catch::Contains("roles.actor.rollout.multi_turn.tool_config_path: is required"));
  CHECK_THAT(ErrorOf(turns("enable: true, tool_config_path: t.yaml, format: gpt-oss")),
             Catch::Contains("multi_turn.format: 'gpt-oss' is not hermes"));
  CHECK_THAT(
      ErrorOf(turns("enable: true, tool_config_path: t.yaml, tool_response_truncate_side: top")),
      Catch::Contains("'top' is not one of: left, right, middle"));
  CHECK_THAT(ErrorOf(turns("enable: true, tool_config_path: t.yaml, max_parallel_calls: 0")),
             Catch::Contains("multi_turn.max_parallel_calls: 0 must be in [1, 64]"));
  // Off, nothing is checked (verl's defaults with enable false).
  CHECK(ParseJobSpec(turns("enable: false, format: other"), "x.yaml").ok());
}

TEST_CASE("LoRA: verl's defaults, and what is refused", "[config]") {
  const std::string yaml = kValidYaml;
  const auto lora = [&](const std::string& keys) {
    return Replace(yaml, "model: {path: /models/tiny}",
                   "model: {path: /models/tiny, " + keys + "}");
  };
  auto spec = ParseJobSpec(lora("lora_rank: 8"), "x.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->model().lora_alpha() == 16);
  CHECK(std::vector<std::string>(spec->model().target_modules().begin(),
                                 spec->model().target_modules().end()) ==
        std::vector<std::string>{"all-linear"});
  CHECK(spec->model().lora_adapter_path().empty());
  CHECK(ParseJobSpec(lora("lora_rank: 8, target_modules: [q_proj, v_proj]"), "x.yaml").ok());
  CHECK(ParseJobSpec(lora("lora_adapter_path: /adapters/a"), "x.yaml").ok());
  CHECK_THAT(ErrorOf(lora("lora_rank: 2000")),
             Catch::Contains("model.lora_rank: 2000 must be in [0, 1024]"));
  CHECK_THAT(ErrorOf(lora("lora_rank: 8, lora_alpha: 0")),
             Catch::Contains("model.lora_alpha: 0 must be positive"));
  CHECK_THAT(ErrorOf(lora("lora_rank: 8, target_modules: [lm_head]")),
             Catch::Contains("model.target_modules: 'lm_head' is not a linear layer of the "
                             "decoder; give \"all-linear\" or layers among q_proj"));
  CHECK_THAT(ErrorOf(lora("lora_rank: 8, target_modules: [all-linear, q_proj]")),
             Catch::Contains("\"all-linear\" already names every layer; give it alone"));
  CHECK_THAT(ErrorOf(lora("lora_rank: 8, target_modules: []")),
             Catch::Contains("model.target_modules: is empty: give \"all-linear\""));
  // Off, the LoRA keys are not checked (verl's defaults with lora_rank 0).
  CHECK(ParseJobSpec(lora("lora_alpha: 0, target_modules: [lm_head]"), "x.yaml").ok());
}

TEST_CASE("out-of-range values say the allowed range", "[config][errors]") {
  const std::string yaml = kValidYaml;
  CHECK_THAT(ErrorOf(With("trainer: {total_epochs: 0}\n")),
             Catch::Contains("trainer.total_epochs: 0 must be in [1, 1000000]"));
  CHECK_THAT(ErrorOf(Replace(yaml, "adv_estimator: grpo,", "adv_estimator: grpo, gamma: 1.5,")),
             Catch::Contains("algorithm.gamma: 1.5 must be in [0, 1]"));
  CHECK_THAT(ErrorOf(Replace(yaml, "rollout: {n: 4}", "rollout: {n: 4, top_p: 0}")),
             Catch::Contains("roles.actor.rollout.top_p: 0 must be in"));
  CHECK_THAT(ErrorOf(Replace(yaml, "rollout: {n: 4}", "rollout: {n: 4, gpu_memory_utilization: 1.5}")),
             Catch::Contains("roles.actor.rollout.gpu_memory_utilization: 1.5 must be in (0, 1)"));
  CHECK_THAT(ErrorOf(Replace(yaml, "adv_estimator: grpo,", "adv_estimator: grpo, clip_ratio_c: 0.5,")),
             Catch::Contains("algorithm.clip_ratio_c: 0.5 must be > 1, or 0"));
  CHECK_THAT(
      ErrorOf(Replace(yaml, "adv_estimator: grpo,", "adv_estimator: grpo, kl_cov_ratio: 0,")),
      Catch::Contains("algorithm.kl_cov_ratio: 0 must be in (0, 1]"));
  CHECK_THAT(
      ErrorOf(Replace(yaml, "adv_estimator: grpo,", "adv_estimator: grpo, clip_cov_ratio: 2,")),
      Catch::Contains("algorithm.clip_cov_ratio: 2 must be in (0, 1]"));
  CHECK_THAT(
      ErrorOf(Replace(yaml, "adv_estimator: grpo,", "adv_estimator: grpo, clip_cov_ub: 0.5,")),
      Catch::Contains("algorithm.clip_cov_ub: 0.5 must be above clip_cov_lb (1)"));
  CHECK_THAT(
      ErrorOf(Replace(yaml, "adv_estimator: grpo,", "adv_estimator: grpo, ppo_kl_coef: -1,")),
      Catch::Contains("algorithm.ppo_kl_coef: -1 must be >= 0"));
  CHECK_THAT(
      ErrorOf(Replace(yaml, "adv_estimator: grpo,", "adv_estimator: grpo, policy_loss: dro,")),
      Catch::Contains("algorithm.dro_beta: 0 must be > 0 with policy_loss dro"));
  CHECK_THAT(ErrorOf(Replace(yaml, "name: unit-test-job", "name: \"has spaces\"")),
             Catch::Contains("name: use 1-128 letters"));
}

TEST_CASE("inconsistent sections are refused with the fix", "[config][errors]") {
  const std::string yaml = kValidYaml;
  // GPU counts vs layouts.
  CHECK_THAT(ErrorOf(Replace(yaml, "train: {", "train: {dp: 3, ")),
             Catch::Contains("roles.actor.train: dp (3) x tp (1) = 3 but roles.actor.gpus is 2; "
                             "set dp to 2"));
  CHECK_THAT(ErrorOf(Replace(yaml, "train: {", "train: {tp: 4, ")),
             Catch::Contains("roles.actor.train.tp: 4 does not divide roles.actor.gpus (2)"));
  CHECK_THAT(ErrorOf(Replace(yaml, "rollout: {n: 4}", "rollout: {n: 4, tp: 4}")),
             Catch::Contains("roles.actor.rollout.tp: 4 must divide roles.actor.gpus (2)"));
  // Batch arithmetic.
  CHECK_THAT(ErrorOf(Replace(yaml, "train_batch_size: 16", "train_batch_size: 12")),
             Catch::Contains("ppo_mini_batch_size: 8 does not divide data.train_batch_size (12)"));
  CHECK_THAT(ErrorOf(Replace(yaml, "micro_batch_size_per_gpu: 4", "micro_batch_size_per_gpu: 5")),
             Catch::Contains("5 does not divide the per-GPU mini-batch of 16 responses"));
  CHECK_THAT(ErrorOf(Replace(Replace(yaml, "gpus: 2", "gpus: 3"), "rollout: {n: 4}",
                             "rollout: {n: 2}")),
             Catch::Contains("8 prompts x rollout.n (2) = 16 responses do not split evenly over "
                             "dp (3)"));
  // Estimator vs roles.
  CHECK_THAT(ErrorOf(Replace(yaml, "adv_estimator: grpo", "adv_estimator: gae")),
             Catch::Contains("roles.critic: is required by algorithm.adv_estimator gae"));
  CHECK_THAT(ErrorOf(With("  critic: {gpus: 1}\n")),
             Catch::Contains("roles.critic: is unused by algorithm.adv_estimator grpo"));
  CHECK_THAT(ErrorOf(Replace(yaml, "rollout: {n: 4}", "rollout: {n: 1}")),
             Catch::Contains("roles.actor.rollout.n: 1 response per prompt leaves"));
  CHECK_THAT(ErrorOf(Replace(Replace(yaml, "rollout: {n: 4}", "rollout: {n: 1}"),
                             "adv_estimator: grpo", "adv_estimator: grpo_passk")),
             Catch::Contains("roles.actor.rollout.n: 1 response per prompt leaves "
                             "algorithm.adv_estimator grpo_passk no group to compare"));
  CHECK(ParseJobSpec(Replace(yaml, "adv_estimator: grpo", "adv_estimator: grpo-passk"), "job.yaml")
            ->algorithm()
            .adv_estimator() == v1::ADVANTAGE_ESTIMATOR_GRPO_PASSK);
  CHECK(ParseJobSpec(Replace(yaml, "adv_estimator: grpo", "adv_estimator: opo"), "job.yaml")
            ->algorithm()
            .adv_estimator() == v1::ADVANTAGE_ESTIMATOR_OPO);
  CHECK_THAT(ErrorOf(Replace(yaml, "  reference: {}\n", "")),
             Catch::Contains("roles.reference: is required by algorithm.kl.mode loss"));
  // Validation only, with nothing to validate on.
  CHECK_THAT(ErrorOf(With("trainer: {val_only: true}\n")),
             Catch::Contains("data.val_files: is required when trainer.val_only is set"));
  CHECK(ParseJobSpec(Replace(With("trainer: {val_only: true}\n"), "train_batch_size: 16",
                             "train_batch_size: 16, val_files: [test.jsonl]"),
                     "job.yaml")
            ->trainer()
            .val_only());
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}", "{rule: gsm8k, remote: http://x}")),
             Catch::Contains("roles.reward: give exactly one of rule, model, remote or "
                             "custom_reward_function"));
  // A Python function is a reward kind of its own: it replaces the rule, as in verl.
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}",
                             "{rule: gsm8k, custom_reward_function: {path: /r.py}}")),
             Catch::Contains("roles.reward: give exactly one of rule, model, remote or "
                             "custom_reward_function (a Python function replaces the rule"));
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}", "{custom_reward_function: {name: f}}")),
             Catch::Contains("roles.reward.custom_reward_function.path: is required"));
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}", "{custom_reward_function: {path: /r.txt}}")),
             Catch::Contains("roles.reward.custom_reward_function.path: '/r.txt' is not a .py"));
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}",
                             "{custom_reward_function: {path: /r.py, name: 'a-b'}}")),
             Catch::Contains("custom_reward_function.name: 'a-b' is not the name of a Python"));
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}",
                             "{custom_reward_function: {path: /r.py, timeout_s: -1, "
                             "processes: 65}}")),
             Catch::Contains("custom_reward_function.timeout_s: -1 must be in") &&
                 Catch::Contains("custom_reward_function.processes: 65 must be in"));
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}",
                             "{custom_reward_function: {path: /r.py, reward_kwargs: [1]}}")),
             Catch::Contains("reward_kwargs: expected a mapping of keys"));
  {
    const auto spec =
        ParseJobSpec(Replace(yaml, "{rule: gsm8k}",
                             "{custom_reward_function: {path: /r.py, reward_kwargs: {scale: 0.5, "
                             "style: {strict: true, tags: [a, 1]}}}}"),
                     "job.yaml");
    INFO(spec.status());
    REQUIRE(spec.ok());
    const v1::PythonRewardSpec& function = spec->roles().reward().custom_reward_function();
    CHECK(function.name() == "compute_score");  // verl's default
    CHECK(function.processes() == 4);
    CHECK(function.timeout_s() == 30);
    CHECK(function.memory_limit_mb() == 8192);
    CHECK(function.reward_kwargs().fields().at("scale").number_value() == 0.5);
    const auto& style = function.reward_kwargs().fields().at("style").struct_value().fields();
    CHECK(style.at("strict").bool_value());
    CHECK(style.at("tags").list_value().values(0).string_value() == "a");
    CHECK(style.at("tags").list_value().values(1).number_value() == 1);
  }
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}", "{rule: vibes}")),
             Catch::Contains("roles.reward.rule: 'vibes' is not one of: gsm8k"));
  CHECK_THAT(
      ErrorOf(Replace(yaml, "{rule: gsm8k}", "{rule: gsm8k, val_rules: [gsm8k_boxed, vibes]}")),
      Catch::Contains("roles.reward.val_rules[1]: 'vibes' is not one of: gsm8k"));
  CHECK_THAT(ErrorOf(Replace(yaml, "{rule: gsm8k}",
                             "{rule: gsm8k, val_rules: [exact_match, exact_match]}")),
             Catch::Contains(
                 "roles.reward.val_rules[1]: 'exact_match' is named twice (also at [0])"));
  CHECK_THAT(ErrorOf(Replace(yaml, "reference: {}", "reference: {gpus: 1}") +
                     "placement: colocated\n"),
             Catch::Contains("roles.reference.gpus: placement colocated runs every role on the "
                             "actor's 2 GPUs"));
  CHECK_THAT(ErrorOf(With("trainer: {save_every: 5}\n")),
             Catch::Contains("trainer.checkpoint_dir: is required when trainer.save_every"));
  CHECK_THAT(ErrorOf(With("trainer: {async_save: true}\n")),
             Catch::Contains("trainer.checkpoint_dir: is required when trainer.async_save"));
  CHECK_THAT(ErrorOf(With("trainer: {checkpoint_uri: s3://ckpt-bucket/run}\n")),
             Catch::Contains("trainer.checkpoint_dir: is required when trainer.checkpoint_uri"));
  CHECK_THAT(ErrorOf(With("trainer: {checkpoint_dir: /c, checkpoint_uri: /data/ckpt}\n")),
             Catch::Contains("trainer.checkpoint_uri: '/data/ckpt' is not an s3:// URI"));
  CHECK_THAT(ErrorOf(With("trainer: {checkpoint_dir: /c, checkpoint_uri: s3://Bad_Bucket/x}\n")),
             Catch::Contains("trainer.checkpoint_uri: 'Bad_Bucket' is not a valid S3 bucket"));
}

TEST_CASE("every problem in a config is reported at once", "[config][errors]") {
  const std::string error = ErrorOf(R"(
name: x
model: {path: /m, dtyp: bf16}
trainer: {seeds: 1}
)");
  // Schema errors and the checks behind them in one pass: nothing hides the rest.
  CHECK_THAT(error, Catch::Contains("5 problems in job.yaml"));
  CHECK_THAT(error, Catch::Contains("model.dtyp: unknown key"));
  CHECK_THAT(error, Catch::Contains("trainer.seeds: unknown key"));
  CHECK_THAT(error, Catch::Contains("data.train_files: is required"));
  CHECK_THAT(error, Catch::Contains("roles.critic: is required by algorithm.adv_estimator gae"));
  CHECK_THAT(error, Catch::Contains("roles.reward: is required"));

  // A type error does not hide four others; what follows from the refused value is not repeated.
  const std::string typed = ErrorOf(Replace(Replace(Replace(Replace(kValidYaml, "gpus: 2", "gpus: two"),
                                                            "train_batch_size: 16",
                                                            "train_batch_size: 16, truncation: middle"),
                                                    "{rule: gsm8k}", "{rule: vibes}"),
                                            "n: 4", "n: 4, top_p: 2"));
  CHECK_THAT(typed, Catch::Contains("4 problems in job.yaml"));
  CHECK_THAT(typed, Catch::Contains("roles.actor.gpus: expected a whole number, got \"two\""));
  CHECK_THAT(typed, Catch::Contains("data.truncation: \"middle\" is not one of: error, left, right"));
  CHECK_THAT(typed, Catch::Contains("roles.reward.rule: 'vibes' is not one of"));
  CHECK_THAT(typed, Catch::Contains("roles.actor.rollout.top_p: 2 must be in"));

  // A bad override is one problem among the others: the good overrides still apply.
  auto overridden =
      ParseJobSpec(kValidYaml, "job.yaml",
                   {"roles.actor.gpus 2", "placement=sideways", "data.train_batch_size=0"});
  REQUIRE_FALSE(overridden.ok());
  const std::string both(overridden.status().message());
  CHECK_THAT(both, Catch::Contains("3 problems in job.yaml"));
  CHECK_THAT(both,
             Catch::Contains("job.yaml: override 'roles.actor.gpus 2': expected key.path=value"));
  CHECK_THAT(both, Catch::Contains("job.yaml: placement: \"sideways\" is not one of"));
  CHECK_THAT(both, Catch::Contains("job.yaml: data.train_batch_size: 0"));
}

TEST_CASE("a spec built by a program gets defaults and validation", "[config]") {
  v1::JobSpec spec;
  spec.set_name("from-code");
  spec.mutable_model()->set_path("/m");
  spec.mutable_data()->add_train_files("a.jsonl");
  spec.mutable_data()->set_train_batch_size(8);
  spec.mutable_algorithm()->set_adv_estimator(v1::ADVANTAGE_ESTIMATOR_GRPO);
  spec.mutable_roles()->mutable_actor()->mutable_rollout()->set_n(2);
  spec.mutable_roles()->mutable_actor()->mutable_train()->set_ppo_mini_batch_size(8);
  spec.mutable_roles()->mutable_reward()->set_rule("math");
  auto completed = CompleteJobSpec(spec, "request");
  REQUIRE(completed.ok());
  CHECK(completed->algorithm().kl().mode() == v1::KL_MODE_NONE);  // verl's default
  CHECK(completed->roles().actor().gpus() == 1);

  spec.mutable_roles()->mutable_actor()->mutable_rollout()->set_n(1);
  auto refused = CompleteJobSpec(spec, "request");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("request: roles.actor.rollout.n"));
}

TEST_CASE("the defaults document matches the schema", "[config]") {
  ConfigErrors errors("defaults");
  NormalizeToSchema(JobSpecDefaults(), *v1::JobSpec::descriptor(), &errors);
  INFO(errors.ToStatus().ToString());
  CHECK(errors.empty());
}

TEST_CASE("a missing config file is a clear error", "[config][errors]") {
  auto spec = LoadJobSpecFile("/nonexistent/job.yaml");
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(spec.status().message()),
             Catch::Contains("cannot read job config: cannot open /nonexistent/job.yaml"));
}

}  // namespace rlhfd::config

namespace rlhfd::config {

TEST_CASE("hostile documents are refused within bounds, with the reason", "[config][limits]") {
  // YAML escapes that produce bytes which are not UTF-8, naming the line.
  CHECK_THAT(ErrorOf(Replace(kValidYaml, "name: unit-test-job", "name: \"\\_\"")),
             Catch::Contains("line 2: a value is not valid UTF-8"));
  CHECK_THAT(ErrorOf(With("\"\\N\": 1\n")), Catch::Contains("a key is not valid UTF-8"));
  // Aliases are charged before they are copied: a kilobyte cannot stand for millions of values.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int level = 1; level < 9; ++level) {
    bomb += "a" + std::to_string(level) + ": &a" + std::to_string(level) + " [";
    for (int i = 0; i < 10; ++i) bomb += (i ? ", *a" : "*a") + std::to_string(level - 1);
    bomb += "]\n";
  }
  CHECK_THAT(ErrorOf(bomb), Catch::Contains("more than 100000 values (after expanding YAML aliases)"));
  // Small aliases still work: the expanded document is what is validated.
  auto aliased = ParseJobSpec(Replace(kValidYaml, "data: {train_files: [train.jsonl], train_batch_size: 16}",
                                      "data: {train_files: &files [a.jsonl, b.jsonl], val_files: *files, "
                                      "train_batch_size: 16}"),
                              "job.yaml");
  REQUIRE(aliased.ok());
  CHECK(aliased->data().val_files_size() == 2);
  // Depth, in both syntaxes.
  CHECK_THAT(ErrorOf(std::string(40, '[') + std::string(40, ']')), Catch::Contains("nested deeper than 32"));
  CHECK_THAT(ErrorOf("{\"a\":" + std::string(40, '[') + std::string(40, ']') + "}", "job.json"),
             Catch::Contains("nested deeper than 32"));
  // Numbers past what they may hold.
  CHECK_THAT(ErrorOf(R"({"algorithm": {"gamma": 1e400}})", "job.json"), Catch::Contains("number overflow"));
  CHECK_THAT(ErrorOf(Replace(kValidYaml, "gpus: 2", "gpus: 99999999999999999999")),
             Catch::Contains("roles.actor.gpus: \"99999999999999999999\" is out of range"));
  CHECK_THAT(ErrorOf(R"({"roles": {"actor": {"rollout": {"top_k": 18446744073709551615}}}})", "job.json"),
             Catch::Contains("roles.actor.rollout.top_k: 18446744073709551615 is out of range"));
  CHECK_THAT(ErrorOf(Replace(kValidYaml, "adv_estimator: grpo", "adv_estimator: grpo, lam: inf")),
             Catch::Contains("algorithm.lam: \"inf\" is not a finite number"));
  // Duplicate keys in JSON as in YAML.
  CHECK_THAT(ErrorOf(R"({"name": "a", "name": "b"})", "job.json"), Catch::Contains("key 'name' appears twice"));
  // Control characters and overlong strings in values.
  CHECK_THAT(ErrorOf(Replace(kValidYaml, "path: /models/tiny", "path: \"/m\\e[2J\"")),
             Catch::Contains("model.path: contains the control character U+001B"));
  CHECK_THAT(ErrorOf(Replace(kValidYaml, "path: /models/tiny", "path: /" + std::string(5000, 'p'))),
             Catch::Contains("model.path: is 5001 bytes long; at most 4096"));
  // Counts far past any real job, and layouts whose product would overflow.
  CHECK_THAT(ErrorOf(Replace(kValidYaml, "gpus: 2", "gpus: 2147483647")),
             Catch::Contains("roles.actor.gpus: 2147483647 must be in [1, 65536]"));
  CHECK_THAT(ErrorOf(Replace(kValidYaml, "train: {", "train: {dp: -2147483647, tp: 2, ")),
             Catch::Contains("roles.actor.train.dp: -2147483647 must be in [0, 65536]"));
  // Thousands of problems are summarised after the first fifty.
  std::string many = kValidYaml;
  for (int i = 0; i < 2000; ++i) many += "unknown_" + std::to_string(i) + ": 1\n";
  const std::string error = ErrorOf(many);
  CHECK_THAT(error, Catch::Contains("2000 problems") && Catch::Contains("... and 1950 more"));
  CHECK(error.size() < 64 * 1024);
}

}  // namespace rlhfd::config

namespace rlhfd::config {

// verl's max_actor_ckpt_to_keep semantics: absent, null or 0 keeps every checkpoint; a positive
// number keeps that many; a negative one is refused with what to write instead.
TEST_CASE("trainer.max_ckpt_to_keep: absent, null and 0 keep all; negative is refused",
          "[config]") {
  auto absent = ParseJobSpec(kValidYaml, "job.yaml");
  REQUIRE(absent.ok());
  CHECK(absent->trainer().max_ckpt_to_keep() == 0);
  auto null = ParseJobSpec(With("trainer: {max_ckpt_to_keep: null}\n"), "job.yaml");
  INFO(null.status().ToString());
  REQUIRE(null.ok());
  CHECK(null->trainer().max_ckpt_to_keep() == 0);
  auto two = ParseJobSpec(With("trainer: {max_ckpt_to_keep: 2}\n"), "job.yaml");
  REQUIRE(two.ok());
  CHECK(two->trainer().max_ckpt_to_keep() == 2);
  CHECK_THAT(ErrorOf(With("trainer: {max_ckpt_to_keep: -1}\n")),
             Catch::Contains("trainer.max_ckpt_to_keep: -1: give the number of newest "
                             "checkpoints to keep (>= 1), or 0 or null to keep them all"));
  // null means "the default" only where verl writes it so; elsewhere it is still refused.
  CHECK_THAT(ErrorOf(With("trainer: {max_restarts: null}\n")),
             Catch::Contains("trainer.max_restarts: has no value"));
}

}  // namespace rlhfd::config

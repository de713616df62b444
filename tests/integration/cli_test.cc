// The programs as a user meets them: every --help lists its flags and exits 0; rlhfctl validate
// and convert-verl offline; and the controller's submit-time checks through rlhfctl submit
// against a real controller (missing model or data, parquet, a layout the engines do not run,
// relative paths, warnings), submit --from-verl, overrides and delete.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "tests/support/cluster_fixture.h"

namespace rlhfd::testing {
namespace {

LocalClusterBinaries Binaries() { return {RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN}; }

const std::string kFixtures = RLHFD_FIXTURES_DIR;
const std::string kModel = kFixtures + "/models/tiny-qwen2";
const std::string kData = kFixtures + "/data/arithmetic_train.jsonl";

std::string Config(const std::string& name, const std::string& model, const std::string& data,
                   const std::string& extra = "") {
  return absl::StrCat("name: ", name, "\nmodel: {path: ", model, ", dtype: fp32}\n",
                      "data: {train_files: [", data, "], train_batch_size: 8}\n",
                      "algorithm: {adv_estimator: grpo}\n", "roles:\n",
                      "  actor: {gpus: 1, train: {ppo_mini_batch_size: 4, "
                      "ppo_micro_batch_size_per_gpu: 2}, rollout: {n: 2}}\n",
                      "  reward: {rule: arithmetic}\n", extra);
}

CommandResult Ctl(const std::vector<std::string>& args, const std::string& cwd = "") {
  std::vector<std::string> argv = {RLHFD_CTL_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, absl::Seconds(30), cwd);
}

}  // namespace

TEST_CASE("every program's --help lists its flags and exits 0", "[integration][cli]") {
  struct Program {
    std::string binary;
    std::vector<std::string> expected;
  };
  std::vector<Program> programs = {
      {RLHFD_CONTROLLER_BIN, {"--state_dir", "--listen", "--shutdown_deadline", "(default: "}},
      {RLHFD_WORKER_BIN, {"--controller", "--device", "--worker_id", "--token_file"}},
      {RLHFD_CTL_BIN, {"--controller", "--token_file", "--tls_ca", "--tls_cert", "RLHFD_TOKEN_FILE",
                       "validate FILE", "convert-verl", "--from-verl"}},
  };
#ifdef RLHFD_INFER_BIN
  programs.push_back({RLHFD_INFER_BIN, {"--model", "--prompts", "rlhfd-infer tokenize",
                                        "rlhfd-infer logprobs", "rlhfd-infer generate",
                                        "rlhfd-infer export"}});
#endif
  for (const Program& program : programs) {
    for (const char* flag : {"--help", "-h"}) {
      INFO(program.binary << " " << flag);
      CommandResult result = RunCommand({program.binary, flag});
      CHECK(result.exit_code == 0);
      CHECK_THAT(result.out, !Catch::Contains("No flags matched"));
      for (const std::string& text : program.expected) CHECK_THAT(result.out, Catch::Contains(text));
    }
  }
}

TEST_CASE("rlhfctl validate works offline and marks what came from defaults", "[integration][cli]") {
  TempDir dir;
  const std::string good = dir.path() + "/good.yaml";
  REQUIRE(WriteFileAtomically(good, Config("good", kModel, kData)).ok());
  CommandResult valid = Ctl({"validate", good, "trainer.total_steps=5"});
  INFO(valid.err);
  CHECK(valid.exit_code == 0);
  CHECK_THAT(valid.out, Catch::Contains("valid;"));
  CHECK_THAT(valid.out, Catch::Contains("  max_prompt_length: 512  # (default)"));
  CHECK_THAT(valid.out, Catch::Contains("      dp: 1  # (derived)"));
  CHECK_THAT(valid.out, Catch::Contains("  total_steps: 5\n"));
  CHECK_THAT(valid.out, Catch::Contains("ppo_micro_batch_size_per_gpu: 2\n"));
  CHECK_THAT(valid.out, Catch::Contains("log_prob_micro_batch_size_per_gpu: 16  # (default; verl "
                                        "has no default: it must be set)"));
  // Every problem at once, files included.
  const std::string bad = dir.path() + "/bad.yaml";
  REQUIRE(WriteFileAtomically(bad, Config("bad", dir.path() + "/no-model", dir.path() + "/no.jsonl",
                                          "trainer: {loggers: [wandb]}\n"))
              .ok());
  CommandResult invalid = Ctl({"validate", bad, "roles.actor.rollout.n=one"});
  CHECK(invalid.exit_code == 1);
  CHECK_THAT(invalid.err, Catch::Contains("roles.actor.rollout.n: expected a whole number"));
  CHECK_THAT(invalid.err, Catch::Contains("trainer.loggers[0]: wandb is not supported"));
  // File checks come after the config is valid.
  CommandResult files = Ctl({"validate", bad, "~trainer"});
  CHECK(files.exit_code == 1);
  CHECK_THAT(files.err, Catch::Contains("model.path: model directory '" + dir.path() +
                                        "/no-model' not found"));
  CHECK_THAT(files.err, Catch::Contains("data.train_files[0]: cannot read data file"));
}

TEST_CASE("rlhfctl convert-verl prints the rlhfd config and what it leaves out",
          "[integration][cli]") {
  CommandResult converted = Ctl({"convert-verl", "-", "algorithm.adv_estimator=grpo",
                                 "actor_rollout_ref.model.path=" + kModel,
                                 "data.train_files=" + kData, "actor_rollout_ref.rollout.n=2",
                                 "actor_rollout_ref.rollout.name=vllm",
                                 "trainer.n_gpus_per_node=1", "data.train_batch_size=8",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"});
  INFO(converted.err);
  CHECK(converted.exit_code == 0);
  CHECK_THAT(converted.out, Catch::Contains("placement: colocated"));
  // What is not honoured: each key once, grouped by why.
  CHECK_THAT(converted.err, Catch::Contains("warning: ignored ('vllm': rlhfd generates with its "
                                            "own engine"));
  CHECK_THAT(converted.err, Catch::Contains("): actor_rollout_ref.rollout.name\n"));
  CHECK_THAT(converted.err,
             Catch::Contains("tensor-parallel rollout on GPUs is not supported yet"));
  CommandResult refused =
      Ctl({"convert-verl", "-", "actor_rollout_ref.model.lora_rank=8", "critic.model.lora_rank=8"});
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Contains("error: not supported (LoRA is not supported yet; train "
                                          "all parameters): actor_rollout_ref.model.lora_rank\n"));
  // An interpolation that cannot be resolved is refused, naming its key.
  CommandResult unresolved = Ctl({"convert-verl", "-", "trainer.project_name=${no.such.key}"});
  CHECK(unresolved.exit_code == 1);
  CHECK_THAT(unresolved.err, Catch::Contains("cannot be resolved: `no.such.key` is not a key of "
                                             "the config): trainer.project_name"));
}

TEST_CASE("the controller checks a job's files and layout at submission", "[integration][cli]") {
  LocalCluster cluster(Binaries(), absl::Milliseconds(200), absl::Seconds(2));
  std::string error;
  REQUIRE(cluster.StartController(&error));
  TempDir dir;
  const auto submit = [&](const std::string& text, std::vector<std::string> overrides = {}) {
    const std::string path = dir.path() + "/job.yaml";
    REQUIRE(WriteFileAtomically(path, text).ok());
    std::vector<std::string> args = {"submit", path};
    args.insert(args.end(), overrides.begin(), overrides.end());
    return cluster.Ctl(args);
  };
  // Model directories.
  CommandResult hub = submit(Config("hub", "Qwen/Qwen2.5-0.5B-Instruct", kData));
  CHECK(hub.exit_code == 1);
  CHECK_THAT(hub.err, Catch::Contains("looks like a Hugging Face hub id, which is not downloaded: "
                                      "put the model on disk"));
  const std::string partial = dir.path() + "/partial-model";
  REQUIRE(MakeDirectories(partial).ok());
  REQUIRE(WriteFileAtomically(partial + "/config.json", "{}").ok());
  REQUIRE(WriteFileAtomically(partial + "/pytorch_model.bin", "x").ok());
  CommandResult incomplete = submit(Config("partial", partial, kData));
  CHECK(incomplete.exit_code == 1);
  CHECK_THAT(incomplete.err, Catch::Contains("is not a complete model directory: no tokenizer.json, "
                                             "no *.safetensors weights (pytorch_model.bin is not read"));
  // A complete directory of a family the workers do not run (Gemma2): refused at submission,
  // naming config.json and what is supported, and with the other problems in the same answer.
  const std::string gemma = dir.path() + "/gemma";
  REQUIRE(MakeDirectories(gemma).ok());
  REQUIRE(WriteFileAtomically(gemma + "/config.json",
                              R"({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"})")
              .ok());
  REQUIRE(WriteFileAtomically(gemma + "/tokenizer.json", "{}").ok());
  REQUIRE(WriteFileAtomically(gemma + "/model.safetensors", "x").ok());
  CommandResult unsupported = submit(Config("gemma", gemma, dir.path() + "/absent.jsonl"));
  CHECK(unsupported.exit_code == 1);
  CHECK_THAT(unsupported.err,
             Catch::Contains("model.path: " + gemma +
                             "/config.json: architecture "
                             "'Gemma2ForCausalLM' is not supported; supported: Llama, Mistral, "
                             "Qwen2, Qwen3 with ForCausalLM") &&
                 Catch::Contains("data.train_files[0]: cannot read data file"));
  // Data files.
  CommandResult missing = submit(Config("missing", kModel, dir.path() + "/absent.jsonl"));
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.err, Catch::Contains("data.train_files[0]: cannot read data file"));
  // A file named .parquet that is not Parquet (the controller reads Parquet: parquet_data_test).
  const std::string fake = dir.path() + "/train.parquet";
  REQUIRE(WriteFileAtomically(fake, "{\"prompt\": \"JSONL in disguise\"}\n").ok());
  CommandResult parquet = submit(Config("parquet", kModel, fake));
  CHECK(parquet.exit_code == 1);
  CHECK_THAT(parquet.err,
             Catch::Contains("data.train_files[0]") && Catch::Contains("is not a Parquet file"));
  const std::string csv = dir.path() + "/train.csv";
  REQUIRE(WriteFileAtomically(csv, "prompt,answer\n1+1,2\n").ok());
  CommandResult not_jsonl = submit(Config("csv", kModel, csv));
  CHECK_THAT(not_jsonl.err, Catch::Contains("is not JSONL"));
  // A layout the engines do not run.
  CommandResult tp = submit(Config("tp", kModel, kData), {"roles.actor.gpus=2",
                                                          "roles.actor.rollout.tp=2"});
  CHECK(tp.exit_code == 1);
  CHECK_THAT(tp.err, Catch::Contains("roles.actor.rollout.tp: 2: the GPU rollout (fused decode, "
                                     "CUDA graphs) runs tensor-parallel size 1 for now"));
  // On CPU workers tp must split the model's heads, key/value heads, MLP and vocabulary.
  CommandResult uneven = submit(Config("tp4", kModel, kData),
                                {"roles.actor.gpus=4", "roles.actor.rollout.tp=4",
                                 "trainer.device=cpu"});
  CHECK(uneven.exit_code == 1);
  CHECK_THAT(uneven.err, Catch::Contains("roles.actor.rollout.tp: 4 does not divide the model's "
                                         "num_key_value_heads (2, "));
  // Accepted, with warnings: larger than the cluster, and a name a live job has.
  CommandResult first = submit(Config("twice", kModel, kData));
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  CHECK_THAT(first.err, Catch::Contains("warning: the job needs 1 workers (one per GPU) and 0 are "
                                        "registered: it stays queued"));
  CommandResult second = submit(Config("twice", kModel, kData));
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.err, Catch::Contains("warning: job job-1 (JOB_STATE_QUEUED) has the same name, "
                                         "'twice'"));
  // Relative paths are the submitter's: rlhfctl sends its working directory.
  CommandResult relative = RunCommand(
      {RLHFD_CTL_BIN, "--controller=" + cluster.address(),
       "--token_file=" + cluster.state_dir() + "/token", "submit", "configs/tiny-cpu-demo.yaml"},
      absl::Seconds(30), RLHFD_SOURCE_DIR);
  INFO(relative.err);
  CHECK(relative.exit_code == 0);
  CommandResult shown = cluster.Ctl({"--json", "status", "job-3"});
  CHECK_THAT(shown.out, Catch::Contains(std::string(RLHFD_SOURCE_DIR) +
                                        "/tests/fixtures/models/tiny-qwen2"));
  // A waiting job says why it waits.
  CommandResult status = cluster.Ctl({"status", "job-1"});
  CHECK_THAT(status.out, Catch::Contains("waiting for workers: needs 1 CPU worker: 0 alive"));
  // submit --from-verl, the conversion done by rlhfctl and the check by the controller.
  CommandResult verl = cluster.Ctl(
      {"submit", "--from-verl", "-", "algorithm.adv_estimator=grpo",
       // verl's default val_files (~/data/rlhf/gsm8k/test.parquet) is verl's, so given here.
       "actor_rollout_ref.model.path=" + kModel, "data.train_files=" + kData,
       "data.val_files=" + kData, "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
       "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
       "trainer.experiment_name=from-verl"});
  INFO(verl.err);
  CHECK(verl.exit_code == 0);
  CHECK_THAT(verl.out, Catch::Contains("submitted job-4 (from-verl)"));
  // delete: ended jobs only; their ids are not given again.
  CHECK(cluster.Ctl({"delete", "job-1"}).exit_code == 1);
  CHECK(cluster.Ctl({"cancel", "job-1"}).exit_code == 0);
  CHECK(cluster.Ctl({"delete", "job-1"}).exit_code == 0);
  CHECK(cluster.Ctl({"status", "job-1"}).exit_code == 1);
  CommandResult after = submit(Config("after-delete", kModel, kData));
  CHECK_THAT(after.out, Catch::Contains("submitted job-5"));
}

}  // namespace rlhfd::testing

// The programs as a user meets them: every --help lists its flags and exits 0; rlhfctl validate
// and convert-verl offline; and the controller's submit-time checks through rlhfctl submit
// against a real controller (missing model or data, parquet, a layout the engines do not run,
// relative paths, warnings), submit --from-verl, overrides and delete.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
      {RLHFD_CTL_BIN,
       {"--controller", "--token_file", "--tls_ca", "--tls_cert", "RLHFD_TOKEN_FILE",
        "validate FILE", "convert-verl", "--from-verl"}},
  };
#ifdef RLHFD_INFER_BIN
  programs.push_back({RLHFD_INFER_BIN,
                      {"--model", "--prompts", "rlhfd-infer tokenize", "rlhfd-infer logprobs",
                       "rlhfd-infer generate", "rlhfd-infer export"}});
#endif
  for (const Program& program : programs) {
    for (const char* flag : {"--help", "-h"}) {
      INFO(program.binary << " " << flag);
      CommandResult result = RunCommand({program.binary, flag});
      CHECK(result.exit_code == 0);
      CHECK_THAT(result.out, !Catch::Contains("No flags matched"));
      for (const std::string& text : program.expected)
        CHECK_THAT(result.out, Catch::Contains(text));
    }
  }
}

TEST_CASE("rlhfctl validate works offline and marks what came from defaults",
          "[integration][cli]") {
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
  // The files are checked in the same pass as the config.
  CHECK_THAT(invalid.err, Catch::Contains("model.path: model directory '" + dir.path() +
                                          "/no-model' not found"));
  CHECK_THAT(invalid.err, Catch::Contains("data.train_files[0]: cannot read data file"));
  CHECK_THAT(invalid.err, Catch::Contains("4 problems in " + bad));
}

// A model directory complete but of a family the workers do not run (Gemma2).
std::string GemmaModel(const std::string& dir) {
  const std::string gemma = dir + "/gemma";
  REQUIRE(MakeDirectories(gemma).ok());
  REQUIRE(WriteFileAtomically(gemma + "/config.json",
                              R"({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"})")
              .ok());
  REQUIRE(WriteFileAtomically(gemma + "/tokenizer.json", "{}").ok());
  REQUIRE(WriteFileAtomically(gemma + "/model.safetensors", "x").ok());
  return gemma;
}

TEST_CASE("one validate and one submit list every problem, of every stage, at once",
          "[integration][cli]") {
  LocalCluster cluster(Binaries(), absl::Milliseconds(200), absl::Seconds(2));
  std::string error;
  REQUIRE(cluster.StartController(&error));
  TempDir dir;
  const std::string gemma = GemmaModel(dir.path());
  const std::string fake_parquet = dir.path() + "/val.parquet";
  REQUIRE(WriteFileAtomically(fake_parquet, "{\"prompt\": \"JSONL in disguise\"}\n").ok());
  // A bad enum, an out-of-range number and an unknown key (the config's checks), an unsupported
  // model family, a missing data file and an unreadable one (the files' checks).
  const std::string path = dir.path() + "/all.yaml";
  REQUIRE(WriteFileAtomically(path, Config("all-at-once", gemma, dir.path() + "/absent.jsonl",
                                           "placement: sideways\n"
                                           "trainer: {total_steps: -3, seeds: 1}\n"))
              .ok());
  const std::vector<std::string> expected = {
      "6 problems in " + path,
      "placement: \"sideways\" is not one of",
      "trainer.total_steps: -3 must be",
      "trainer.seeds: unknown key",
      "model.path: " + gemma + "/config.json: architecture 'Gemma2ForCausalLM' is not supported",
      "data.train_files[0]: cannot read data file",
      "data.val_files[0]: " + fake_parquet + " is not a Parquet file"};
  CommandResult validated = Ctl({"validate", path, "data.val_files=[" + fake_parquet + "]"});
  CHECK(validated.exit_code == 1);
  CommandResult submitted = cluster.Ctl({"submit", path, "data.val_files=[" + fake_parquet + "]"});
  CHECK(submitted.exit_code == 1);
  for (const std::string& text : expected) {
    CHECK_THAT(validated.err, Catch::Contains(text));
    CHECK_THAT(submitted.err, Catch::Contains(text));
  }
  // Fixed, it is valid and queued.
  REQUIRE(WriteFileAtomically(path, Config("all-at-once", kModel, kData)).ok());
  CHECK(Ctl({"validate", path}).exit_code == 0);
  CHECK(cluster.Ctl({"submit", path}).exit_code == 0);
}

#ifdef RLHFD_HAVE_PARQUET
TEST_CASE(
    "a broken Parquet file is refused at submission within a second; the controller serves on",
    "[integration][cli][parquet]") {
  LocalCluster cluster(Binaries(), absl::Milliseconds(200), absl::Seconds(2));
  std::string error;
  REQUIRE(cluster.StartController(&error));
  TempDir dir;
  const CommandResult made = RunCommand(
      {RLHFD_PYTHON, kFixtures + "/make_parquet_rows.py", dir.path()}, absl::Seconds(120));
  INFO(made.out << made.err);
  REQUIRE(made.exit_code == 0);
  const auto submit = [&](const std::string& name) {
    const std::string path = dir.path() + "/job.yaml";
    REQUIRE(WriteFileAtomically(path, Config(name, kModel, dir.path() + "/" + name)).ok());
    return cluster.Ctl({"submit", path});
  };
  for (const auto& [name, words] : std::vector<std::pair<std::string, std::string>>{
           {"int_prompt.parquet", ":1: the prompt under 'prompt' (data.prompt_key) is a number"},
           {"list_truth.parquet",
            ":1: under 'ground_truth' (data.answer_key): ground truth: the "
            "arithmetic rule needs a number, and the row has array"},
           {"truncated.parquet", "is not a Parquet file"},
           {"hollow.parquet", "rows 1001-2000 (row group 1), column '"},
           {"big_cell.parquet", ":2: column 'prompt' holds a string of 5000000 bytes"},
           {"huge_cell.parquet", "rows 1-3 (row group 0), column 'prompt': decoding needs more"}}) {
    INFO(name);
    const absl::Time start = absl::Now();
    const CommandResult refused = submit(name);
    const absl::Duration took = absl::Now() - start;
    INFO(refused.err << "in " << took);
    CHECK(refused.exit_code == 1);
    CHECK(took < absl::Seconds(1));
    CHECK_THAT(refused.err, Catch::Contains("data.train_files[0]: " + dir.path() + "/" + name));
    CHECK_THAT(refused.err, Catch::Contains(words));
  }
  // The same controller takes the next job, Parquet or JSONL.
  CommandResult parquet = submit("verl.parquet");
  INFO(parquet.err);
  CHECK(parquet.exit_code == 0);
  CHECK_THAT(parquet.out, Catch::Contains("submitted job-1"));
  REQUIRE(WriteFileAtomically(dir.path() + "/jsonl.yaml", Config("jsonl", kModel, kData)).ok());
  CHECK(cluster.Ctl({"submit", dir.path() + "/jsonl.yaml"}).exit_code == 0);
}
#endif

TEST_CASE("rlhfctl convert-verl prints the rlhfd config and what it leaves out",
          "[integration][cli]") {
  CommandResult converted =
      Ctl({"convert-verl", "-", "algorithm.adv_estimator=grpo",
           "actor_rollout_ref.model.path=" + kModel, "data.train_files=" + kData,
           "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=vllm",
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
  CHECK_THAT(converted.err, Catch::Contains("verl's default 2 does not divide the job's 1 GPU;"));
  CommandResult refused =
      Ctl({"convert-verl", "-", "actor_rollout_ref.model.lora_rank=8", "critic.model.lora_rank=8"});
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Contains("error: not supported (LoRA critics are not supported "
                                          "yet (the actor's LoRA is)): critic.model.lora_rank\n"));
  CHECK(refused.err.find("actor_rollout_ref.model.lora_rank") == std::string::npos);
  // An interpolation that cannot be resolved is refused, naming its key.
  CommandResult unresolved = Ctl({"convert-verl", "-", "trainer.project_name=${no.such.key}"});
  CHECK(unresolved.exit_code == 1);
  CHECK_THAT(unresolved.err, Catch::Contains("cannot be resolved: `no.such.key` is not a key of "
                                             "the config): trainer.project_name"));
}

// verl's SFT trainer's config (--sft): converted to an SFT job, checked offline with validate
// --from-verl --sft, its refusals named; --sft goes only with a verl conversion.
TEST_CASE("rlhfctl convert-verl --sft and validate --from-verl --sft", "[integration][cli]") {
  const std::vector<std::string> run = {
      "-",
      "model.path=" + kModel,
      "data.train_files=" + kFixtures + "/data/tool_sft_verl.jsonl",
      "data.train_batch_size=8",
      "optim.lr=1e-5",
      "trainer.logger=[console]",
      "trainer.device=cpu"};
  std::vector<std::string> convert = {"convert-verl", "--sft"};
  convert.insert(convert.end(), run.begin(), run.end());
  CommandResult converted = Ctl(convert);
  INFO(converted.out << converted.err);
  CHECK(converted.exit_code == 0);
  CHECK_THAT(converted.out, Catch::Contains("  mode: sft\n"));
  CHECK_THAT(converted.out, Catch::Contains("ppo_mini_batch_size: 8\n"));
  std::vector<std::string> validate = {"validate", "--from-verl", "--sft"};
  validate.insert(validate.end(), run.begin(), run.end());
  CommandResult validated = Ctl(validate);
  INFO(validated.out << validated.err);
  CHECK(validated.exit_code == 0);
  CHECK_THAT(validated.out, Catch::Contains(": valid;"));
  CommandResult refused =
      Ctl({"convert-verl", "--sft", "-", "engine.ulysses_sequence_parallel_size=2"});
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Contains("(sequence parallelism is not supported): "
                                          "engine.ulysses_sequence_parallel_size\n"));
  CommandResult misplaced = Ctl({"--sft", "jobs"});
  CHECK(misplaced.exit_code == 2);
  CHECK_THAT(misplaced.err, Catch::Contains("--sft goes with convert-verl, or with --from-verl"));
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
  CHECK_THAT(incomplete.err,
             Catch::Contains("is not a complete model directory: no tokenizer.json, "
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
  // A quantized checkpoint of a family it runs (Qwen2.5-7B-Instruct-AWQ's config): refused at
  // submission by its quantization, not at the job's start by a list of packed tensors.
  REQUIRE(WriteFileAtomically(gemma + "/config.json",
                              R"({"architectures": ["Qwen2ForCausalLM"], "quantization_config": )"
                              R"({"bits": 4, "quant_method": "awq", "version": "gemm"}})")
              .ok());
  CommandResult quantized = submit(Config("awq", gemma, kData));
  CHECK(quantized.exit_code == 1);
  CHECK_THAT(quantized.err, Catch::Contains("model.path: " + gemma +
                                            "/config.json: the checkpoint is quantized (awq)"));
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
  // tp must split the model's heads, key/value heads, MLP and vocabulary.
  CommandResult uneven =
      submit(Config("tp4", kModel, kData),
             {"roles.actor.gpus=4", "roles.actor.rollout.tp=4", "trainer.device=cpu"});
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
  CHECK_THAT(shown.out,
             Catch::Contains(std::string(RLHFD_SOURCE_DIR) + "/tests/fixtures/models/tiny-qwen2"));
  // A waiting job says why it waits.
  CommandResult status = cluster.Ctl({"status", "job-1"});
  CHECK_THAT(status.out, Catch::Contains("waiting for workers: needs 1 CPU worker: 0 alive"));
  // submit --from-verl, the conversion done by rlhfctl and the check by the controller. verl
  // picks the reward by each row's data_source (rule auto), and the controller checks the first
  // rows pick one: the fixture's 'arithmetic' rows do not. (verl's default val_files,
  // ~/data/rlhf/gsm8k/test.parquet, is verl's, so each run names its own.)
  const std::vector<std::string> verl_args = {
      "submit",
      "--from-verl",
      "-",
      "algorithm.adv_estimator=grpo",
      "actor_rollout_ref.model.path=" + kModel,
      "actor_rollout_ref.rollout.n=2",
      "trainer.n_gpus_per_node=1",
      "data.train_batch_size=8",
      "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
      "trainer.experiment_name=from-verl"};
  std::vector<std::string> unscored = verl_args;
  unscored.push_back("data.train_files=" + kData);
  unscored.push_back("data.val_files=" + kData);
  CommandResult refused = cluster.Ctl(unscored);
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Contains("arithmetic_train.jsonl:1: data_source 'arithmetic' "
                                          "picks no reward rule under roles.reward.rule auto"));
  std::string gsm8k_rows;
  for (int i = 1; i <= 8; ++i) {
    absl::StrAppend(&gsm8k_rows, R"({"prompt": "What is )", i, R"( + 1?", "data_source": )",
                    R"("openai/gsm8k", "reward_model": {"ground_truth": ")", i + 1, "\"}}\n");
  }
  REQUIRE(WriteFileAtomically(dir.path() + "/gsm8k.jsonl", gsm8k_rows).ok());
  std::vector<std::string> scored = verl_args;
  scored.push_back("data.train_files=" + dir.path() + "/gsm8k.jsonl");
  scored.push_back("data.val_files=" + dir.path() + "/gsm8k.jsonl");
  CommandResult verl = cluster.Ctl(scored);
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

// rlhfd-infer as a user runs it: tokenize gives Hugging Face's ids, logprobs gives the model's
// per-token log-probabilities, bad input exits non-zero with a reason.
#include <ATen/ATen.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <functional>

#include "common/util/files.h"
#include "tests/support/subprocess.h"
#include "worker/model/model_loader.h"
#include "worker/model/tokenizer.h"

namespace rlhfd::testing {
namespace {

const std::string kModel = std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2";

nlohmann::json Infer(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {RLHFD_INFER_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult result = RunCommand(argv);
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  return nlohmann::json::parse(result.out);
}

}  // namespace

TEST_CASE("rlhfd-infer tokenize prints Hugging Face's ids", "[infer]") {
  auto golden_text =
      ReadFileToString(std::string(RLHFD_FIXTURES_DIR) + "/tokenizers/qwen2-style/golden.json");
  REQUIRE(golden_text.ok());
  const nlohmann::json golden = nlohmann::json::parse(*golden_text);
  const auto& entry = golden["encode"][1];
  nlohmann::json out =
      Infer({"tokenize", "--model=" + kModel, "--text=" + entry["text"].get<std::string>()});
  CHECK(out["ids"] == entry["ids"]);
  CHECK(out["count"] == entry["ids"].size());
}

TEST_CASE("rlhfd-infer logprobs equals transformers' log-softmax", "[infer]") {
  auto golden_text = ReadFileToString(kModel + "/logprobs_golden.json");
  REQUIRE(golden_text.ok());
  const nlohmann::json golden = nlohmann::json::parse(*golden_text);
  nlohmann::json out = Infer({"logprobs", "--model=" + kModel,
                              "--prompt=" + golden["prompt"].get<std::string>(),
                              "--text=" + golden["text"].get<std::string>()});
  REQUIRE(out["tokens"].size() == golden["text_ids"].size());
  for (size_t i = 0; i < out["tokens"].size(); ++i) {
    CHECK(out["tokens"][i]["id"] == golden["text_ids"][i]);
    CHECK(out["tokens"][i]["logprob"].get<double>() ==
          Approx(golden["logprobs"][i].get<double>()).margin(1e-5));
  }
  CHECK(out["total_logprob"].get<double>() ==
        Approx(golden["total_logprob"].get<double>()).margin(1e-4));
}

// A copy of a fixture model directory whose `file` is replaced by `edit(json)`.
std::string EditedModel(const TempDir& dir, const std::string& fixture, const std::string& file,
                        const std::function<void(nlohmann::json&)>& edit) {
  const std::string from = std::string(RLHFD_FIXTURES_DIR) + "/models/" + fixture;
  const std::string to = dir.path() + "/" + fixture;
  REQUIRE(MakeDirectories(to).ok());
  auto names = ListDirectory(from);
  REQUIRE(names.ok());
  for (const std::string& name : *names) {
    auto text = ReadFileToString(from + "/" + name);
    REQUIRE(text.ok());
    std::string contents = *text;
    if (name == file) {
      nlohmann::json json = nlohmann::json::parse(contents);
      edit(json);
      contents = json.dump();
    }
    REQUIRE(WriteFileAtomically(to + "/" + name, contents).ok());
  }
  return to;
}

TEST_CASE("rlhfd-infer refuses ids past the vocabulary instead of aborting", "[infer]") {
  TempDir dir;
  // The tokenizer has a token (id 700) the 512-row embedding has no row for.
  const std::string model = EditedModel(dir, "tiny-qwen2", "tokenizer.json", [](nlohmann::json& json) {
    json["added_tokens"].push_back({{"id", 700}, {"content", "<|extra|>"}, {"special", true},
                                    {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                    {"normalized", false}});
  });
  CommandResult result =
      RunCommand({RLHFD_INFER_BIN, "logprobs", "--model=" + model, "--text=a <|extra|> b"});
  CHECK(result.exit_code == 1);
  CHECK_THAT(result.err, Catch::Contains("the tokenizer has ids up to 700 but config.json's "
                                         "vocab_size is 512"));
  // Prompt ids given directly are checked too.
  const std::string prompts = dir.path() + "/prompts.jsonl";
  REQUIRE(WriteFileAtomically(prompts, R"({"prompt_ids": [5, 9999, 7]})" "\n").ok());
  result = RunCommand({RLHFD_INFER_BIN, "generate", "--model=" + kModel, "--prompts=" + prompts,
                       "--max_new_tokens=2"});
  CHECK(result.exit_code == 1);
  CHECK_THAT(result.err, Catch::Contains("9999"));
}

TEST_CASE("a sliding-window model runs where its sequences fit in the window", "[infer]") {
  TempDir dir;
  const std::string model = EditedModel(dir, "tiny-mistral", "config.json",
                                        [](nlohmann::json& json) { json["sliding_window"] = 64; });
  const std::string tokenizer_dir = std::string(RLHFD_FIXTURES_DIR) + "/tokenizers/qwen2-style";
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    auto text = ReadFileToString(tokenizer_dir + "/" + file);
    REQUIRE(text.ok());
    REQUIRE(WriteFileAtomically(model + "/" + file, *text).ok());
  }
  CommandResult fits =
      RunCommand({RLHFD_INFER_BIN, "logprobs", "--model=" + model, "--text=short enough"});
  INFO(fits.err);
  CHECK(fits.exit_code == 0);
  std::string long_text;
  for (int i = 0; i < 80; ++i) long_text += " w" + std::to_string(i);
  CommandResult longer =
      RunCommand({RLHFD_INFER_BIN, "logprobs", "--model=" + model, "--text=" + long_text});
  CHECK(longer.exit_code == 1);
  CHECK_THAT(longer.err, Catch::Contains("window of 64 tokens") &&
                             Catch::Contains("--prompt and --text together reach"));
}

TEST_CASE("rlhfd-infer refuses bad input with a reason", "[infer]") {
  CommandResult missing =
      RunCommand({RLHFD_INFER_BIN, "logprobs", "--model=/nonexistent", "--text=x"});
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.err, Catch::Contains("/nonexistent/tokenizer.json"));
  CommandResult usage = RunCommand({RLHFD_INFER_BIN, "tokenize"});
  CHECK(usage.exit_code == 2);
  CommandResult dtype =
      RunCommand({RLHFD_INFER_BIN, "logprobs", "--model=" + kModel, "--text=x y", "--dtype=int4"});
  CHECK(dtype.exit_code != 0);
  CHECK_THAT(dtype.err, Catch::Contains("--dtype"));
}

TEST_CASE("rlhfd-infer generate prints one JSON line per sample", "[infer]") {
  TempDir dir;
  auto golden_text = ReadFileToString(kModel + "/generate_golden.json");
  REQUIRE(golden_text.ok());
  const nlohmann::json golden = nlohmann::json::parse(*golden_text);
  const std::string prompts = dir.path() + "/prompts.jsonl";
  REQUIRE(WriteFileAtomically(
              prompts, nlohmann::json{{"prompt_ids", golden["cases"][0]["prompt"]}}.dump() + "\n" +
                           R"({"messages": [{"role": "user", "content": "What is 2 + 3?"}]})" +
                           "\n" + R"({"prompt": "Hello, world"})" + "\n")
              .ok());
  CommandResult result =
      RunCommand({RLHFD_INFER_BIN, "generate", "--model=" + kModel, "--prompts=" + prompts,
                  "--temperature=0", "--max_new_tokens=12", "--n=2"});
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  std::vector<nlohmann::json> lines;
  std::istringstream out(result.out);
  for (std::string line; std::getline(out, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 6);  // 3 prompts x 2 samples.
  CHECK(lines[0]["index"] == 0);
  CHECK(lines[1]["sample"] == 1);
  CHECK(lines[0]["token_ids"] == golden["cases"][0]["output"]);  // transformers' greedy output.
  CHECK(lines[1]["token_ids"] == golden["cases"][0]["output"]);
  for (const auto& line : lines) {
    CHECK(line["logprobs"].size() == line["token_ids"].size());
    CHECK((line["finish_reason"] == "stop" || line["finish_reason"] == "length"));
  }
  CHECK_THAT(result.err, Catch::Contains("generated_tokens"));

  REQUIRE(WriteFileAtomically(prompts, "{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n").ok());
  CommandResult bad =
      RunCommand({RLHFD_INFER_BIN, "generate", "--model=" + kModel, "--prompts=" + prompts});
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.err, Catch::Contains("prompts.jsonl:2"));
}

}  // namespace rlhfd::testing

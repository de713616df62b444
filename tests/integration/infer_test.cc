// rlhfd-infer as a user runs it: tokenize gives Hugging Face's ids, logprobs gives the model's
// per-token log-probabilities, bad input exits non-zero with a reason.
#include <ATen/ATen.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

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

TEST_CASE("rlhfd-infer logprobs equals the model's log-softmax", "[infer]") {
  nlohmann::json out =
      Infer({"logprobs", "--model=" + kModel, "--prompt=The answer is", "--text= 42, not 7."});
  auto tokenizer = model::Tokenizer::Load(kModel);
  auto transformer = model::LoadModel(kModel, {});
  REQUIRE(tokenizer.ok());
  REQUIRE(transformer.ok());
  std::vector<int32_t> prompt = *tokenizer->Encode("The answer is");
  std::vector<int32_t> text = *tokenizer->Encode(" 42, not 7.");
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), text.begin(), text.end());
  torch::NoGradGuard no_grad;
  at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
  at::Tensor logp = at::log_softmax((*transformer)->Logits((*transformer)->Hidden({input}))[0], -1);
  REQUIRE(out["tokens"].size() == text.size());
  double total = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t position = prompt.size() + i;
    const double expected = logp[position - 1][ids[position]].item<double>();
    CHECK(out["tokens"][i]["id"] == text[i]);
    CHECK(out["tokens"][i]["logprob"].get<double>() == Approx(expected).margin(1e-5));
    total += expected;
  }
  CHECK(out["total_logprob"].get<double>() == Approx(total).margin(1e-4));
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

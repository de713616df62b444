// The controller's Parquet reader (librlhfd_parquet.so, Arrow C++) against files pyarrow writes
// (tests/fixtures/make_parquet_rows.py): verl's row schema reads to the same prompts as the same
// rows in JSONL (an independent path: nlohmann's JSON parser), across row groups, with a
// dictionary-encoded column and a binary column nobody reads; bad files are refused naming the
// file and the row group, row or column; submission reads the first row.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "controller/driver/prompt_data.h"
#include "tests/support/subprocess.h"

namespace rlhfd::controller {
namespace {

using testing::TempDir;

class ParquetFiles {
 public:
  ParquetFiles() {
    ::setenv("RLHFD_PARQUET_PLUGIN", RLHFD_PARQUET_PLUGIN_PATH, 1);
    const testing::CommandResult made = testing::RunCommand(
        {RLHFD_PYTHON, RLHFD_MAKE_PARQUET_ROWS, dir_.path()}, absl::Seconds(120));
    INFO(made.out << made.err);
    REQUIRE(made.exit_code == 0);
  }
  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }

 private:
  TempDir dir_;
};

void CheckSameRows(const PromptData& parquet, const PromptData& jsonl) {
  REQUIRE(parquet.size() == jsonl.size());
  for (int64_t i = 0; i < parquet.size(); ++i) {
    INFO("row " << i + 1);
    CHECK(parquet.row(i).DebugString() == jsonl.row(i).DebugString());
    CHECK(parquet.origin(i).line == i + 1);
  }
}

TEST_CASE("verl's Parquet rows read as the same prompts as their JSONL", "[parquet]") {
  const ParquetFiles files;
  for (const std::string name : {"verl", "numbers", "lists"}) {
    INFO(name);
    auto parquet = PromptData::Load({files.path(name + ".parquet")}, v1::DataSpec());
    INFO(parquet.status());
    REQUIRE(parquet.ok());
    auto jsonl = PromptData::Load({files.path(name + ".jsonl")}, v1::DataSpec());
    REQUIRE(jsonl.ok());
    CheckSameRows(*parquet, *jsonl);
  }
  auto verl = PromptData::Load({files.path("verl.parquet")}, v1::DataSpec());
  REQUIRE(verl.ok());
  REQUIRE(verl->size() == 10);  // four row groups of 3, 3, 3 and 1
  CHECK(verl->row(9).chat_size() == 2);
  CHECK(verl->row(9).chat(1).role() == "user");
  CHECK(verl->row(9).data_source() == "openai/gsm8k");  // dictionary-encoded in the file
  CHECK(verl->row(9).ground_truth_json() == "\"25\"");  // reward_model.ground_truth
  // extra_info, a struct column, travels as an object for Python and remote rewards.
  const nlohmann::json extra = nlohmann::json::parse(verl->row(9).extra_info_json());
  CHECK(extra["split"] == "train");
  CHECK(extra["index"] == 9);
  CHECK(extra["answer"] == "#### 9");
  CHECK(extra.size() == 4);
  auto numbers = PromptData::Load({files.path("numbers.parquet")}, v1::DataSpec());
  REQUIRE(numbers.ok());
  CHECK(numbers->row(0).ground_truth_json() == "42");
  CHECK(numbers->row(1).ground_truth_json().empty());  // null: none
  CHECK(numbers->row(0).extra_info_json().empty());    // no extra_info column
  // A dotted key reaches into a struct column: extra_info.answer as the answer.
  v1::DataSpec answer_key;
  answer_key.set_answer_key("extra_info.answer");
  auto answers = PromptData::Load({files.path("verl.parquet")}, answer_key);
  REQUIRE(answers.ok());
  CHECK(answers->row(3).ground_truth_json() == "\"#### 3\"");
  // Files of both kinds in one list: rows in order, each with its own origin.
  auto both =
      PromptData::Load({files.path("numbers.parquet"), files.path("lists.jsonl")}, v1::DataSpec());
  REQUIRE(both.ok());
  REQUIRE(both->size() == 3);
  CHECK(both->origin(2).file == files.path("lists.jsonl"));
  CHECK(CheckFirstParquetRow(files.path("verl.parquet"), v1::DataSpec()).ok());
}

TEST_CASE("A bad Parquet file is refused naming the file and what is wrong", "[parquet]") {
  const ParquetFiles files;
  const auto refused = [&](const std::string& name, absl::StatusCode code,
                           const std::vector<std::string>& words) {
    INFO(name);
    const absl::Status loaded = PromptData::Load({files.path(name)}, v1::DataSpec()).status();
    INFO(loaded);
    CHECK(loaded.code() == code);
    CHECK_THAT(std::string(loaded.message()), Catch::Contains(files.path(name)));
    for (const std::string& word : words) {
      CHECK_THAT(std::string(loaded.message()), Catch::Contains(word));
    }
    // What submission checks sees the same.
    CHECK(CheckFirstParquetRow(files.path(name), v1::DataSpec()).code() == code);
  };
  refused("binary_prompt.parquet", absl::StatusCode::kInvalidArgument,
          {":1", "column 'prompt'", "binary"});
  refused("no_prompt.parquet", absl::StatusCode::kInvalidArgument,
          {"none of the columns", "question, answer"});
  refused("text.parquet", absl::StatusCode::kInvalidArgument, {"is not a Parquet file"});
  refused("truncated.parquet", absl::StatusCode::kInvalidArgument, {"is not a Parquet file"});
  refused("garbled.parquet", absl::StatusCode::kInvalidArgument, {"row group 0"});
  refused("missing.parquet", absl::StatusCode::kNotFound, {"cannot be read"});
}

}  // namespace
}  // namespace rlhfd::controller

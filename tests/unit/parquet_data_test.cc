// The controller's Parquet reader (librlhfd_parquet.so, Arrow C++) against files pyarrow writes
// (tests/fixtures/make_parquet_rows.py): verl's row schema reads to the same prompts as the same
// rows in JSONL (an independent path: nlohmann's JSON parser), across row groups, with a
// dictionary-encoded column and a binary column nobody reads; bad files are refused naming the
// file and the row group, row or column; submission reads the metadata and the first rows, and
// refuses a broken file (wrong column type, cut, a 100 MB cell) within a second.
#include <stdlib.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
  CHECK(verl->row(9).chat_size() == 1);  // verl's gsm8k.py: one user message
  CHECK(verl->row(9).chat(0).role() == "user");
  CHECK_THAT(verl->row(9).chat(0).content(),
             Catch::EndsWith(" Let's think step by step and output the final answer after "
                             "\"####\"."));
  CHECK(verl->row(9).data_source() == "openai/gsm8k");  // dictionary-encoded in the file
  CHECK(verl->row(9).ground_truth_json() == "\"72\"");  // reward_model.ground_truth
  CHECK(verl->row(4).ground_truth_json() == "\"1500\"");  // "#### 1,500", commas dropped
  // extra_info, a struct column, travels as an object for Python and remote rewards.
  const nlohmann::json extra = nlohmann::json::parse(verl->row(9).extra_info_json());
  CHECK(extra["split"] == "train");
  CHECK(extra["index"] == 9);
  CHECK(absl::EndsWith(extra["answer"].get<std::string>(), "#### 72"));
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
  CHECK(answers->row(3).ground_truth_json() ==
        "\"Together they cost 2 + 1 = <<2+1=3>>3 dollars.\\n#### 3\"");
  // Files of both kinds in one list: rows in order, each with its own origin.
  auto both =
      PromptData::Load({files.path("numbers.parquet"), files.path("lists.jsonl")}, v1::DataSpec());
  REQUIRE(both.ok());
  REQUIRE(both->size() == 3);
  CHECK(both->origin(2).file == files.path("lists.jsonl"));
  CHECK(CheckDataHead(files.path("verl.parquet"), v1::DataSpec(), "").ok());
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
    CHECK(CheckDataHead(files.path(name), v1::DataSpec(), "").code() == code);
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

TEST_CASE("Submission checks the first rows against the reward rule, as the worker reads them",
          "[parquet]") {
  const ParquetFiles files;
  for (const std::string format : {".parquet", ".jsonl"}) {
    INFO(format);
    // verl's gsm8k rows: rule auto picks gsm8k by their data_source; countdown cannot read them.
    CHECK(CheckDataHead(files.path("verl" + format), v1::DataSpec(), "auto").ok());
    CHECK(CheckDataHead(files.path("verl" + format), v1::DataSpec(), "gsm8k").ok());
    const absl::Status countdown =
        CheckDataHead(files.path("verl" + format), v1::DataSpec(), "countdown");
    CHECK_THAT(std::string(countdown.message()),
               Catch::Contains(files.path("verl" + format) +
                               ":1: under 'ground_truth' "
                               "(data.answer_key): ground truth: the countdown rule needs"));
    // reward_model.ground_truth as a list: the gsm8k rule reads text or a number.
    const absl::Status listed =
        CheckDataHead(files.path("list_truth" + format), v1::DataSpec(), "auto");
    CHECK(listed.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(listed.message()),
               Catch::Contains(files.path("list_truth" + format) +
                               ":1: under 'ground_truth' (data.answer_key): ground truth: the "
                               "gsm8k rule compares with text or a number, and the row has array"));
    // No data_source: auto has no rule for it. A null ground truth: nothing to compare with.
    const absl::Status unknown =
        CheckDataHead(files.path("numbers" + format), v1::DataSpec(), "auto");
    CHECK_THAT(std::string(unknown.message()),
               Catch::Contains(":1: data_source '' picks no reward rule under roles.reward.rule "
                               "auto"));
    const absl::Status null =
        CheckDataHead(files.path("numbers" + format), v1::DataSpec(), "exact_match");
    CHECK_THAT(std::string(null.message()), Catch::Contains(":2: under 'ground_truth'") &&
                                                Catch::Contains("and the row has null"));
    // No rule (a reward model scores): the rows need only make prompts.
    CHECK(CheckDataHead(files.path("numbers" + format), v1::DataSpec(), "").ok());
  }
}

TEST_CASE("Rows a few KB of Parquet can say and no reader should hold are refused by name",
          "[parquet]") {
  const ParquetFiles files;
  // Row 17's chat of 400,000 turns: past the rows submission reads, refused at the job's start
  // by the row's bound on values, before the row is built.
  const std::string many = files.path("many_values.parquet");
  CHECK(CheckDataHead(many, v1::DataSpec(), "").ok());
  const absl::Status flooded = PromptData::Load({many}, v1::DataSpec()).status();
  INFO(flooded);
  CHECK(flooded.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(flooded.message()),
             Catch::Contains(many + ":17: the row holds more than 1000000 values") &&
                 Catch::Contains("column 'prompt'"));
  // One 100 KB prompt in 300 rows (30 MB from 5 KB): within the default bounds it loads; past a
  // floor of 1 MiB its expansion is refused, and a data set over its bytes is refused.
  const std::string repeated = files.path("repeated.parquet");
  const auto loaded = PromptData::Load({repeated}, v1::DataSpec());
  REQUIRE(loaded.ok());
  CHECK(loaded->size() == 300);
  const absl::Status bomb = PromptData::Load({repeated}, v1::DataSpec(), RowKind::kPrompt, "",
                                             DataBounds{.expansion_floor_bytes = 1 << 20})
                                .status();
  CHECK(bomb.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bomb.message()), Catch::Contains(repeated + ":") &&
                                              Catch::Contains(": the file's 5") &&
                                              Catch::Contains("refused as a decompression bomb"));
  const absl::Status over = PromptData::Load({repeated}, v1::DataSpec(), RowKind::kPrompt, "",
                                             DataBounds{.max_bytes = 5 << 20})
                                .status();
  CHECK_THAT(std::string(over.message()),
             Catch::Contains(repeated + ":") &&
                 Catch::Contains(": the data files read so far hold") &&
                 Catch::Contains("the controller holds a data set in"));
  // A file of no rows is refused at submission (as an empty JSONL file is).
  const absl::Status empty = CheckDataHead(files.path("empty.parquet"), v1::DataSpec(), "");
  CHECK(empty.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(empty.message()), Catch::Contains("empty.parquet' holds no rows"));
  // Row groups whose counts do not add up to the footer's (one says 2^63 - 1): refused, where
  // the count's overflow used to skip the group's rows without a word.
  const std::string counts = files.path("row_counts.parquet");
  for (const absl::Status& read : {PromptData::Load({counts}, v1::DataSpec()).status(),
                                   CheckDataHead(counts, v1::DataSpec(), "")}) {
    CHECK(read.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(read.message()),
               Catch::Contains("row group 1 claims 9223372036854775807 rows") &&
                   Catch::Contains("the file is corrupt"));
  }
  // A float32 ground truth reads as the decimal written, as pyarrow's to_pylist gives it.
  const auto floats = PromptData::Load({files.path("float_truth.parquet")}, v1::DataSpec());
  REQUIRE(floats.ok());
  CHECK(floats->row(0).ground_truth_json() == "2.7");
}

// Peak resident memory of this process, in bytes.
int64_t PeakResidentBytes() {
  struct rusage usage = {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

TEST_CASE(
    "A broken Parquet file is refused at submission within a second, naming file, row and "
    "column",
    "[parquet]") {
  const ParquetFiles files;
  const auto refused_at_submission = [&](const std::string& name,
                                         const std::vector<std::string>& words) {
    INFO(name);
    const absl::Time start = absl::Now();
    const absl::Status checked = CheckDataHead(files.path(name), v1::DataSpec(), "");
    const absl::Duration took = absl::Now() - start;
    INFO(checked << " in " << took);
    CHECK(checked.code() == absl::StatusCode::kInvalidArgument);
    CHECK(took < absl::Seconds(1));
    CHECK_THAT(std::string(checked.message()), Catch::Contains(files.path(name)));
    for (const std::string& word : words) {
      CHECK_THAT(std::string(checked.message()), Catch::Contains(word));
    }
  };
  // A column of the wrong type: every row's, so the first row says it.
  refused_at_submission("int_prompt.parquet",
                        {":1: the prompt under 'prompt' (data.prompt_key) is a number"});
  refused_at_submission("binary_prompt.parquet", {":1: column 'prompt' holds binary"});
  // A cut file: its footer does not decode; a file whose data was cut out under a whole footer:
  // a later row group's chunks lie outside it, found before any row is decoded.
  refused_at_submission("truncated.parquet", {"is not a Parquet file"});
  refused_at_submission("hollow.parquet",
                        {"rows 1001-2000 (row group 1), column '", "outside the file's"});
  // A 5 MB cell decodes and is refused by its size, naming the row; a 100 MB one is refused by
  // the reader's memory cap before it is read whole, naming its rows, column and the limits.
  refused_at_submission("big_cell.parquet", {":2: column 'prompt' holds a string of 5000000 bytes, "
                                             "over the 1048576 bytes a cell may"});
  const int64_t peak_before = PeakResidentBytes();
  refused_at_submission("huge_cell.parquet",
                        {"rows 1-3 (row group 0), column 'prompt': decoding needs more than the "
                         "67108864 bytes",
                         "the 1048576 bytes one may be"});
  // Less than the cell: it was not read whole (the cap is 64 MiB).
  CHECK(PeakResidentBytes() - peak_before < 90'000'000);
  // Starting the job reads them the same way.
  for (const std::string name : {"huge_cell.parquet", "big_cell.parquet", "hollow.parquet"}) {
    INFO(name);
    CHECK(PromptData::Load({files.path(name)}, v1::DataSpec()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  // A row group past the first rows that does not decode: submission reads the metadata (whole)
  // and the first rows, so it passes there; the job's start reads every row and fails naming the
  // rows, row group and column (docs/data.md).
  const std::string late = files.path("garbled_late.parquet");
  CHECK(CheckDataHead(late, v1::DataSpec(), "").ok());
  const absl::Status loaded = PromptData::Load({late}, v1::DataSpec()).status();
  INFO(loaded);
  CHECK(loaded.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(loaded.message()),
             Catch::Contains(late + ": rows 2001-2064 (row group 2), column '") &&
                 Catch::Contains("' does not decode"));
}

}  // namespace
}  // namespace rlhfd::controller

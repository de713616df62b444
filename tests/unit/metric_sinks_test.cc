// The controller's metric sinks: CRC32C against its published check value, verl's JSONL shape,
// and TensorBoard event files read back by tensorboard's own EventAccumulator (Python); NaN and
// infinities written as such, here and in the metric history; a resumed run's steps once.
#include "controller/metrics/metric_sinks.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/stages/response_samples.h"
#include "common/util/crc32c.h"
#include "common/util/metric_value.h"
#include "controller/store/metric_history.h"
#include "tests/support/subprocess.h"

namespace rlhfd::controller {
namespace {

using rlhfd::testing::RunCommand;
using rlhfd::testing::TempDir;

v1::StepMetrics Step(int64_t step, double score) {
  v1::StepMetrics metrics;
  metrics.set_step(step);
  metrics.set_time_ms(1764590000000 + step * 1000);
  (*metrics.mutable_metrics())["critic/score/mean"] = score;
  (*metrics.mutable_metrics())["timing_s/step"] = 0.25 * step;
  return metrics;
}

TEST_CASE("CRC32C and TFRecord's mask", "[metrics]") {
  CHECK(Crc32c("123456789") == 0xE3069283u);  // the standard check value
  CHECK(Crc32c("") == 0u);
  CHECK(MaskCrc32c(0) == 0xa282ead8u);
}

TEST_CASE("jsonl and tensorboard sinks write every step readably", "[metrics]") {
  TempDir dir;
  auto sinks = MakeMetricSinks("job-7", {"console", "jsonl", "tensorboard"}, dir.path());
  REQUIRE(sinks.ok());
  REQUIRE(sinks->size() == 3);
  for (int64_t step = 1; step <= 3; ++step) {
    for (auto& sink : *sinks) REQUIRE(sink->Write(Step(step, 0.1 * step)).ok());
  }
  sinks->clear();  // closes the files

  std::ifstream jsonl(dir.path() + "/metrics.jsonl");
  std::string line;
  int64_t step = 0;
  while (std::getline(jsonl, line)) {
    ++step;
    const nlohmann::json row = nlohmann::json::parse(line);
    CHECK(row["step"] == step);
    CHECK(row["data"]["critic/score/mean"].get<double>() == Approx(0.1 * step));
    CHECK(row["data"]["timing_s/step"].get<double>() == Approx(0.25 * step));
  }
  CHECK(step == 3);

  const auto read = RunCommand({RLHFD_PYTHON, RLHFD_READ_TENSORBOARD, dir.path() + "/tensorboard"},
                               absl::Seconds(60));
  INFO(read.err);
  REQUIRE(read.exit_code == 0);
  const nlohmann::json scalars = nlohmann::json::parse(read.out);
  REQUIRE(scalars.contains("critic/score/mean"));
  REQUIRE(scalars["critic/score/mean"].size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(scalars["critic/score/mean"][i][0] == i + 1);
    CHECK(scalars["critic/score/mean"][i][1].get<double>() == Approx(0.1 * (i + 1)).epsilon(1e-6));
    CHECK(scalars["timing_s/step"][i][1].get<double>() == Approx(0.25 * (i + 1)));
  }
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Every line of a metrics.jsonl, parsed.
std::vector<nlohmann::json> JsonlRows(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// The TensorBoard directory's scalars, read by tensorboard itself.
nlohmann::json ReadTensorBoard(const std::string& dir) {
  const auto read = RunCommand({RLHFD_PYTHON, RLHFD_READ_TENSORBOARD, dir}, absl::Seconds(60));
  INFO(read.err);
  REQUIRE(read.exit_code == 0);
  return nlohmann::json::parse(read.out);
}

TEST_CASE("NaN and infinities are written as such by every sink and the history", "[metrics]") {
  CHECK(FormatMetric(kNaN) == "NaN");
  CHECK(FormatMetric(-kInf, 4) == "-Infinity");
  CHECK(FormatMetric(0.123456, 4) == "0.1235");
  CHECK(MetricToJson(kInf) == "Infinity");
  CHECK(MetricToJson(1.5) == 1.5);
  CHECK(std::isnan(*MetricFromJson(nlohmann::json("NaN"))));
  CHECK(std::isnan(*MetricFromJson(nlohmann::json())));  // older histories wrote null
  CHECK(*MetricFromJson(nlohmann::json("-Infinity")) == -kInf);
  CHECK_FALSE(MetricFromJson(nlohmann::json("nan")).has_value());

  TempDir dir;
  v1::StepMetrics step = Step(1, 0.5);
  (*step.mutable_metrics())["actor/pg_loss"] = kNaN;
  (*step.mutable_metrics())["actor/grad_norm"] = kInf;
  (*step.mutable_metrics())["actor/kl_loss"] = -kInf;
  {
    auto sinks = MakeMetricSinks("job-7", {"console", "jsonl", "tensorboard"}, dir.path());
    REQUIRE(sinks.ok());
    for (auto& sink : *sinks) {
      REQUIRE(sink->StartRun(0).ok());
      REQUIRE(sink->Write(step).ok());
    }
  }
  const std::vector<nlohmann::json> rows = JsonlRows(dir.path() + "/metrics.jsonl");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["data"]["actor/pg_loss"] == "NaN");
  CHECK(rows[0]["data"]["actor/grad_norm"] == "Infinity");
  CHECK(rows[0]["data"]["actor/kl_loss"] == "-Infinity");
  CHECK(rows[0]["data"]["critic/score/mean"] == 0.5);
  const nlohmann::json scalars = ReadTensorBoard(dir.path() + "/tensorboard");
  CHECK(scalars["actor/pg_loss"] == nlohmann::json::parse(R"([[1, "NaN"]])"));
  CHECK(scalars["actor/grad_norm"] == nlohmann::json::parse(R"([[1, "Infinity"]])"));
  CHECK(scalars["actor/kl_loss"] == nlohmann::json::parse(R"([[1, "-Infinity"]])"));

  auto history = OpenSqliteMetricHistory(dir.path() + "/metrics.db");
  REQUIRE(history.ok());
  REQUIRE((*history)->Put("job-7", step).ok());
  auto read = (*history)->Get("job-7", 0);
  REQUIRE(read.ok());
  REQUIRE(read->size() == 1);
  const auto& metrics = (*read)[0].metrics();
  REQUIRE(metrics.count("actor/pg_loss") == 1);
  CHECK(std::isnan(metrics.at("actor/pg_loss")));
  REQUIRE(metrics.count("actor/grad_norm") == 1);
  CHECK(metrics.at("actor/grad_norm") == kInf);
  REQUIRE(metrics.count("actor/kl_loss") == 1);
  CHECK(metrics.at("actor/kl_loss") == -kInf);
  CHECK(metrics.at("critic/score/mean") == 0.5);
}

TEST_CASE("a resumed run's sinks hold each step once, with the new run's values", "[metrics]") {
  TempDir dir;
  // The first run: validation (step 0) and steps 1..5, then a write a crash cut short.
  {
    auto sinks = MakeMetricSinks("job-7", {"jsonl", "tensorboard"}, dir.path());
    REQUIRE(sinks.ok());
    for (auto& sink : *sinks) REQUIRE(sink->StartRun(0).ok());
    for (int64_t step = 0; step <= 5; ++step) {
      for (auto& sink : *sinks) REQUIRE(sink->Write(Step(step, 0.1 * step)).ok());
    }
  }
  {
    std::ofstream torn(dir.path() + "/metrics.jsonl", std::ios::app);
    torn << R"({"data":{"critic/score/mean":0.6},"st)";
  }
  // The second run resumes from the checkpoint of step 3: steps 4.. again, other values.
  {
    auto sinks = MakeMetricSinks("job-7", {"jsonl", "tensorboard"}, dir.path());
    REQUIRE(sinks.ok());
    for (auto& sink : *sinks) REQUIRE(sink->StartRun(3).ok());
    for (int64_t step = 4; step <= 6; ++step) {
      for (auto& sink : *sinks) REQUIRE(sink->Write(Step(step, 1.0 * step)).ok());
    }
  }
  const auto expected_score = [](int64_t step) { return step <= 3 ? 0.1 * step : 1.0 * step; };
  const std::vector<nlohmann::json> rows = JsonlRows(dir.path() + "/metrics.jsonl");
  REQUIRE(rows.size() == 7);
  for (int64_t step = 0; step <= 6; ++step) {
    INFO("step " << step);
    CHECK(rows[step]["step"] == step);
    CHECK(rows[step]["data"]["critic/score/mean"].get<double>() ==
          Approx(expected_score(step)).epsilon(1e-6));
  }
  nlohmann::json scalars = ReadTensorBoard(dir.path() + "/tensorboard");
  REQUIRE(scalars["critic/score/mean"].size() == 7);
  for (int64_t step = 0; step <= 6; ++step) {
    INFO("step " << step);
    CHECK(scalars["critic/score/mean"][step][0] == step);
    CHECK(scalars["critic/score/mean"][step][1].get<double>() ==
          Approx(expected_score(step)).epsilon(1e-6));
  }

  // A run from the start (no checkpoint) drops everything, step 0 included.
  {
    auto sinks = MakeMetricSinks("job-7", {"jsonl", "tensorboard"}, dir.path());
    REQUIRE(sinks.ok());
    for (auto& sink : *sinks) REQUIRE(sink->StartRun(0).ok());
    for (auto& sink : *sinks) REQUIRE(sink->Write(Step(1, 7.0)).ok());
  }
  const std::vector<nlohmann::json> again = JsonlRows(dir.path() + "/metrics.jsonl");
  REQUIRE(again.size() == 1);
  CHECK(again[0]["step"] == 1);
  scalars = ReadTensorBoard(dir.path() + "/tensorboard");
  CHECK(scalars["critic/score/mean"] == nlohmann::json::parse("[[1, 7.0]]"));
}

// A step with `train` training samples and `val` validation ones, texts naming step and row.
v1::StepMetrics StepWithSamples(int64_t step, int train, int val) {
  v1::StepMetrics metrics = Step(step, 0.5);
  for (int i = 0; i < train + val; ++i) {
    const bool validation = i >= train;
    const int64_t row = validation ? i - train : i;
    *metrics.add_samples() = stages::MakeResponseSample(
        row, absl::StrCat("prompt ", step, "/", row, "\nsecond line"),
        absl::StrCat("response ", step, "/", row), 0.25 * static_cast<double>(row), validation);
  }
  return metrics;
}

// The TensorBoard directory's text summaries, read by tensorboard itself.
nlohmann::json ReadTensorBoardText(const std::string& dir) {
  const auto read =
      RunCommand({RLHFD_PYTHON, RLHFD_READ_TENSORBOARD, "--text", dir}, absl::Seconds(60));
  INFO(read.err);
  REQUIRE(read.exit_code == 0);
  return nlohmann::json::parse(read.out);
}

TEST_CASE("samples: bounded texts, samples.jsonl, TensorBoard text, the history, resumed runs",
          "[metrics][samples]") {
  // Bounds: 2,000 bytes at a character boundary, invalid UTF-8 replaced.
  const std::string long_text = std::string(1999, 'a') + "\xC3\xA9" + "tail";
  const v1::ResponseSample cut = stages::MakeResponseSample(3, long_text, "ok\xC3", 1.0, false);
  CHECK(cut.prompt() == std::string(1999, 'a'));
  CHECK(cut.prompt_truncated());
  CHECK(cut.response() == "ok\xEF\xBF\xBD");
  CHECK_FALSE(cut.response_truncated());

  TempDir dir;
  {
    auto sinks = MakeMetricSinks("job-7", {"console", "jsonl", "tensorboard"}, dir.path());
    REQUIRE(sinks.ok());
    for (auto& sink : *sinks) REQUIRE(sink->StartRun(0).ok());
    for (int64_t step = 0; step <= 3; ++step) {
      // Step 0 is validation only; step 3 validates too.
      const v1::StepMetrics written =
          StepWithSamples(step, step == 0 ? 0 : 2, step == 0 || step == 3 ? 1 : 0);
      for (auto& sink : *sinks) REQUIRE(sink->Write(written).ok());
    }
  }
  std::vector<nlohmann::json> rows = JsonlRows(dir.path() + "/samples.jsonl");
  REQUIRE(rows.size() == 8);  // 1 + 2 + 2 + 3
  CHECK(rows[0] == nlohmann::json::parse(R"({"step": 0, "row": 0, "validation": true,
      "score": 0.0, "prompt": "prompt 0/0\nsecond line", "response": "response 0/0",
      "prompt_truncated": false, "response_truncated": false})"));
  CHECK(rows[2]["step"] == 1);
  CHECK(rows[2]["row"] == 1);
  CHECK(rows[2]["score"] == 0.25);
  CHECK(rows[2]["response"] == "response 1/1");
  CHECK(rows[7]["validation"] == true);
  CHECK(JsonlRows(dir.path() + "/metrics.jsonl").size() == 4);

  const nlohmann::json text = ReadTensorBoardText(dir.path() + "/tensorboard");
  REQUIRE(text.contains("samples/train"));
  REQUIRE(text.contains("samples/val"));
  REQUIRE(text["samples/train"].size() == 3);  // steps 1..3
  CHECK(text["samples/train"][0][0] == 1);
  REQUIRE(text["samples/train"][0][1].size() == 2);
  const std::string shown = text["samples/train"][0][1][1];
  CHECK_THAT(shown, Catch::Contains("**row 1**, score 0.25") &&
                        Catch::Contains("prompt 1/1\nsecond line") &&
                        Catch::Contains("response 1/1"));
  CHECK(text["samples/val"].size() == 2);  // steps 0 and 3
  // The scalars are unchanged by the text beside them.
  CHECK(ReadTensorBoard(dir.path() + "/tensorboard")["critic/score/mean"].size() == 4);

  // A run resumed after step 1 drops the later steps' samples and writes its own.
  {
    auto sinks = MakeMetricSinks("job-7", {"jsonl"}, dir.path());
    REQUIRE(sinks.ok());
    for (auto& sink : *sinks) REQUIRE(sink->StartRun(1).ok());
    for (auto& sink : *sinks) REQUIRE(sink->Write(StepWithSamples(2, 1, 0)).ok());
  }
  rows = JsonlRows(dir.path() + "/samples.jsonl");
  REQUIRE(rows.size() == 4);  // step 0's one, step 1's two, the new step 2's one
  CHECK(rows[3]["step"] == 2);
  CHECK(rows[2]["step"] == 1);

  // The history keeps them apart from the metrics; a re-run step replaces its samples.
  auto history = OpenSqliteMetricHistory(dir.path() + "/metrics.db");
  REQUIRE(history.ok());
  REQUIRE((*history)->Put("job-7", StepWithSamples(1, 2, 0)).ok());
  REQUIRE((*history)->Put("job-7", StepWithSamples(2, 2, 1)).ok());
  REQUIRE((*history)->Put("job-7", Step(3, 0.5)).ok());              // none
  REQUIRE((*history)->Put("job-7", StepWithSamples(2, 1, 0)).ok());  // step 2 again
  auto metrics = (*history)->Get("job-7", 0);
  REQUIRE(metrics.ok());
  REQUIRE(metrics->size() == 3);
  CHECK((*metrics)[0].samples().empty());
  auto samples = (*history)->GetSamples("job-7", 0);
  REQUIRE(samples.ok());
  REQUIRE(samples->size() == 2);
  CHECK((*samples)[0].step() == 1);
  CHECK((*samples)[0].metrics().empty());
  REQUIRE((*samples)[0].samples_size() == 2);
  CHECK((*samples)[0].samples(1).response() == "response 1/1");
  CHECK((*samples)[1].step() == 2);
  CHECK((*samples)[1].samples_size() == 1);
  auto later = (*history)->GetSamples("job-7", 1);
  REQUIRE(later.ok());
  CHECK(later->size() == 1);
  REQUIRE((*history)->Remove("job-7").ok());
  auto removed = (*history)->GetSamples("job-7", 0);
  REQUIRE(removed.ok());
  CHECK(removed->empty());

  // A long job's samples come a bounded number of steps at a time, the next after the last.
  const int64_t steps = MetricHistory::kMaxSampleSteps + 10;
  for (int64_t step = 1; step <= steps; ++step) {
    REQUIRE((*history)->Put("job-8", StepWithSamples(step, 1, 0)).ok());
  }
  auto first = (*history)->GetSamples("job-8", 0);
  REQUIRE(first.ok());
  REQUIRE(static_cast<int64_t>(first->size()) == MetricHistory::kMaxSampleSteps);
  CHECK(first->back().step() == MetricHistory::kMaxSampleSteps);
  auto rest = (*history)->GetSamples("job-8", first->back().step());
  REQUIRE(rest.ok());
  REQUIRE(rest->size() == 10u);
  CHECK(rest->front().step() == MetricHistory::kMaxSampleSteps + 1);
  CHECK(rest->back().step() == steps);
}

TEST_CASE("an unknown logger or an unwritable directory is a clear error", "[metrics]") {
  auto unknown = MakeMetricSinks("job-1", {"wandb"}, "/tmp");
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.status().message()), Catch::Contains("wandb"));
  auto unwritable = MakeMetricSinks("job-1", {"jsonl"}, "/proc/rlhfd-no-such-dir");
  REQUIRE_FALSE(unwritable.ok());
  CHECK_THAT(std::string(unwritable.status().message()), Catch::Contains("/proc/rlhfd-no-such-dir"));
}

}  // namespace
}  // namespace rlhfd::controller

// The controller's metric sinks: CRC32C against its published check value, verl's JSONL shape,
// and TensorBoard event files read back by tensorboard's own EventAccumulator (Python).
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/util/crc32c.h"
#include "controller/metrics/metric_sinks.h"
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

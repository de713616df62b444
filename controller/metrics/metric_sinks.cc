#include "controller/metrics/metric_sinks.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "absl/time/clock.h"
#include "common/util/crc32c.h"
#include "common/util/files.h"

namespace rlhfd::controller {
namespace {

// A file appended to, flushed after each record so a reader (or a crash) sees whole steps.
class AppendFile {
 public:
  static absl::StatusOr<AppendFile> Open(const std::string& path) {
    std::FILE* file = std::fopen(path.c_str(), "ab");
    if (file == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot open ", path, " for metrics: ", std::strerror(errno)));
    }
    return AppendFile(path, file);
  }
  absl::Status Append(const std::string& bytes) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), file_.get()) != bytes.size() ||
        std::fflush(file_.get()) != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("writing metrics to ", path_, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  struct Closer {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  AppendFile(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

// Metrics in name order, as every sink writes them.
std::map<std::string, double> Sorted(const v1::StepMetrics& step) {
  return {step.metrics().begin(), step.metrics().end()};
}

class ConsoleSink final : public MetricSink {
 public:
  explicit ConsoleSink(std::string job_id) : job_id_(std::move(job_id)) {}
  absl::Status Write(const v1::StepMetrics& step) override {
    // verl's console logger: "step:N - name:value - ...".
    std::string line = absl::StrCat(job_id_, " step:", step.step());
    for (const auto& [name, value] : Sorted(step)) absl::StrAppend(&line, " - ", name, ":", value);
    RLOG(INFO) << line;
    return absl::OkStatus();
  }

 private:
  std::string job_id_;
};

class JsonlSink final : public MetricSink {
 public:
  explicit JsonlSink(AppendFile file) : file_(std::move(file)) {}
  absl::Status Write(const v1::StepMetrics& step) override {
    nlohmann::json data = nlohmann::json::object();
    for (const auto& [name, value] : Sorted(step)) data[name] = value;
    return file_.Append(nlohmann::json{{"step", step.step()}, {"data", data}}.dump() + "\n");
  }

 private:
  AppendFile file_;
};

// Protobuf wire format, for the few fields of tensorflow.Event and Summary written here.
void Varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
template <typename T>
void Fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}
void LengthDelimited(std::string& out, int field, const std::string& bytes) {
  Varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  Varint(out, bytes.size());
  out += bytes;
}

// Event{wall_time = 1 (double), step = 2 (int64), file_version = 3 | summary = 5}.
std::string EventHeader(double wall_time, int64_t step) {
  std::string event;
  Varint(event, (1 << 3) | 1);
  Fixed(event, wall_time);
  Varint(event, (2 << 3) | 0);
  Varint(event, static_cast<uint64_t>(step));
  return event;
}

class TensorBoardSink final : public MetricSink {
 public:
  static absl::StatusOr<std::unique_ptr<TensorBoardSink>> Open(const std::string& dir) {
    RETURN_IF_ERROR(MakeDirectories(dir));
    char host[256] = "localhost";
    (void)gethostname(host, sizeof(host) - 1);
    const double now = static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6;
    ASSIGN_OR_RETURN(AppendFile file,
                     AppendFile::Open(absl::StrCat(dir, "/events.out.tfevents.",
                                                   static_cast<int64_t>(now), ".", host)));
    auto sink = std::unique_ptr<TensorBoardSink>(new TensorBoardSink(std::move(file)));
    std::string version = EventHeader(now, 0);
    LengthDelimited(version, 3, "brain.Event:2");
    RETURN_IF_ERROR(sink->Record(version));
    return sink;
  }

  absl::Status Write(const v1::StepMetrics& step) override {
    std::string summary;
    for (const auto& [name, value] : Sorted(step)) {
      std::string item;
      LengthDelimited(item, 1, name);       // Summary.Value.tag
      Varint(item, (2 << 3) | 5);           // Summary.Value.simple_value (float)
      Fixed(item, static_cast<float>(value));
      LengthDelimited(summary, 1, item);    // Summary.value
    }
    std::string event = EventHeader(static_cast<double>(step.time_ms()) / 1000.0, step.step());
    LengthDelimited(event, 5, summary);
    return Record(event);
  }

 private:
  explicit TensorBoardSink(AppendFile file) : file_(std::move(file)) {}

  // TFRecord: length, masked CRC of the length, data, masked CRC of the data.
  absl::Status Record(const std::string& data) {
    std::string length;
    Fixed(length, static_cast<uint64_t>(data.size()));
    std::string record = length;
    Fixed(record, MaskCrc32c(Crc32c(length)));
    record += data;
    Fixed(record, MaskCrc32c(Crc32c(data)));
    return file_.Append(record);
  }

  AppendFile file_;
};

}  // namespace

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

absl::StatusOr<std::vector<std::unique_ptr<MetricSink>>> MakeMetricSinks(
    const std::string& job_id, const std::vector<std::string>& loggers, const std::string& dir) {
  std::vector<std::unique_ptr<MetricSink>> sinks;
  for (const std::string& logger : loggers) {
    if (logger == "console") {
      sinks.push_back(std::make_unique<ConsoleSink>(job_id));
    } else if (logger == "jsonl") {
      RETURN_IF_ERROR(MakeDirectories(dir));
      ASSIGN_OR_RETURN(AppendFile file, AppendFile::Open(dir + "/metrics.jsonl"));
      sinks.push_back(std::make_unique<JsonlSink>(std::move(file)));
    } else if (logger == "tensorboard") {
      ASSIGN_OR_RETURN(std::unique_ptr<TensorBoardSink> sink,
                       TensorBoardSink::Open(dir + "/tensorboard"));
      sinks.push_back(std::move(sink));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer.loggers: '", logger, "' is not console, jsonl or tensorboard"));
    }
  }
  return sinks;
}

}  // namespace rlhfd::controller

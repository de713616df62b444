#include "controller/metrics/metric_sinks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging/logging.h"
#include "common/stages/response_samples.h"
#include "common/status/status_macros.h"
#include "common/util/crc32c.h"
#include "common/util/files.h"
#include "common/util/metric_value.h"
#include "common/util/text.h"

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

// A logged text's bytes in a console line (the files keep what the worker sent).
constexpr size_t kConsoleTextBytes = 500;

class ConsoleSink final : public MetricSink {
 public:
  explicit ConsoleSink(std::string job_id) : job_id_(std::move(job_id)) {}
  absl::Status StartRun(int64_t) override { return absl::OkStatus(); }
  absl::Status Write(const v1::StepMetrics& step) override {
    // verl's console logger: "step:N - name:value - ...".
    std::string line = absl::StrCat(job_id_, " step:", step.step());
    for (const auto& [name, value] : Sorted(step)) {
      absl::StrAppend(&line, " - ", name, ":", FormatMetric(value));
    }
    RLOG(INFO) << line;
    // verl prints a logged generation as [prompt] / [response] / [score]; here one line each
    // sample, its texts escaped and shortened for the log.
    for (const v1::ResponseSample& sample : step.samples()) {
      RLOG(INFO) << job_id_ << " step:" << step.step() << " sample"
                 << (sample.validation() ? " (validation)" : "") << " row:" << sample.row()
                 << " score:" << FormatMetric(sample.score()) << " [prompt] "
                 << SanitizeForDisplay(sample.prompt(), kConsoleTextBytes) << " [response] "
                 << SanitizeForDisplay(sample.response(), kConsoleTextBytes);
    }
    return absl::OkStatus();
  }

 private:
  std::string job_id_;
};

// The step of a metrics.jsonl line; none for a line that is not a whole record (a write a crash
// cut short).
std::optional<int64_t> StepOfLine(absl::string_view line) {
  if (line.empty() || line.back() != '\n') return std::nullopt;
  const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer()) {
    return std::nullopt;
  }
  return row["step"].get<int64_t>();
}

// Cuts the file at `path` after its last line of a step <= `keep_through`, reading back from its
// end: lines are in step order (each run cuts before it appends), so the work is the lines
// dropped, not the file. One ftruncate, so a crash leaves the file cut or whole, never torn.
absl::Status CutAfterStep(const std::string& path, int64_t keep_through) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open ", path, " to drop re-run steps: ", std::strerror(errno)));
  }
  const auto close_fd = absl::MakeCleanup([fd] { ::close(fd); });
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    return absl::InternalError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  }
  constexpr off_t kBlock = 1 << 16;
  std::string tail;  // the file's bytes [tail_start, cut)
  off_t tail_start = info.st_size, cut = info.st_size;
  while (cut > 0) {
    // The last line before `cut` starts after the newline before its own final byte.
    size_t begin = std::string::npos;
    while (true) {
      const size_t end = static_cast<size_t>(cut - tail_start);
      if (end >= 2) begin = tail.rfind('\n', end - 2);
      if (begin != std::string::npos || tail_start == 0) break;
      const off_t more = std::min(kBlock, tail_start);
      std::string block(static_cast<size_t>(more), '\0');
      if (::pread(fd, block.data(), block.size(), tail_start - more) != more) {
        return absl::InternalError(absl::StrCat("reading ", path, ": ", std::strerror(errno)));
      }
      tail = block + tail;
      tail_start -= more;
    }
    begin = begin == std::string::npos ? 0 : begin + 1;
    const absl::string_view line(tail.data() + begin,
                                 static_cast<size_t>(cut - tail_start) - begin);
    const std::optional<int64_t> step = StepOfLine(line);
    if (step && *step <= keep_through) break;
    cut = tail_start + static_cast<off_t>(begin);
    tail.resize(begin);
  }
  if (cut == info.st_size) return absl::OkStatus();
  if (::ftruncate(fd, cut) != 0 || ::fsync(fd) != 0) {
    return absl::InternalError(
        absl::StrCat("cutting ", path, " after step ", keep_through, ": ", std::strerror(errno)));
  }
  RLOG(INFO) << "dropped " << info.st_size - cut << " bytes of "
             << (keep_through < 0 ? std::string("every step")
                                  : absl::StrCat("the steps after ", keep_through))
             << " from " << path << " (this run writes them again)";
  return absl::OkStatus();
}

// metrics.jsonl, and samples.jsonl beside it: a line per logged response, {"step": N, "row": R,
// "validation": false, "score": S, "prompt": ..., "response": ..., "prompt_truncated": false,
// "response_truncated": false}.
class JsonlSink final : public MetricSink {
 public:
  struct File {
    std::string path;
    AppendFile file;  // opened for appending: writes land at the end, wherever a cut left it
  };
  JsonlSink(File metrics, File samples)
      : metrics_(std::move(metrics)), samples_(std::move(samples)) {}
  absl::Status StartRun(int64_t resumed_after) override {
    // From the start, step 0 (validation before training) runs again too.
    const int64_t keep_through = resumed_after > 0 ? resumed_after : -1;
    RETURN_IF_ERROR(CutAfterStep(metrics_.path, keep_through));
    return CutAfterStep(samples_.path, keep_through);
  }
  absl::Status Write(const v1::StepMetrics& step) override {
    nlohmann::json data = nlohmann::json::object();
    for (const auto& [name, value] : Sorted(step)) data[name] = MetricToJson(value);
    RETURN_IF_ERROR(
        metrics_.file.Append(nlohmann::json{{"step", step.step()}, {"data", data}}.dump() + "\n"));
    if (step.samples().empty()) return absl::OkStatus();
    std::string lines;
    for (const v1::ResponseSample& sample : step.samples()) {
      const nlohmann::json line = {{"step", step.step()},
                                   {"row", sample.row()},
                                   {"validation", sample.validation()},
                                   {"score", MetricToJson(sample.score())},
                                   {"prompt", sample.prompt()},
                                   {"response", sample.response()},
                                   {"prompt_truncated", sample.prompt_truncated()},
                                   {"response_truncated", sample.response_truncated()}};
      lines += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
    // One write: a crash leaves the step's samples whole or cut at a line (CutAfterStep drops a
    // line it cut).
    return samples_.file.Append(lines);
  }

 private:
  File metrics_;
  File samples_;
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

// A sample as the text plugin shows it (Markdown): its row and score, then the texts verbatim.
std::string SampleMarkdown(const v1::ResponseSample& sample) {
  const auto verbatim = [](const std::string& text, bool truncated) {
    return absl::StrCat(
        "\n\n```\n", text, "\n```",
        truncated ? absl::StrCat("\n\n(cut at ", stages::kMaxSampleTextBytes, " bytes)") : "");
  };
  return absl::StrCat("**row ", sample.row(), "**, score ", FormatMetric(sample.score()),
                      "\n\nprompt:", verbatim(sample.prompt(), sample.prompt_truncated()),
                      "\n\nresponse:", verbatim(sample.response(), sample.response_truncated()));
}

// Summary.Value{tag = 1, metadata = 9, tensor = 8} of TensorBoard's text plugin: a string tensor
// of shape [texts] (the plugin shows it as a table, a row per text).
std::string TextValue(const std::string& tag, const std::vector<std::string>& texts) {
  std::string plugin_data;
  LengthDelimited(plugin_data, 1, "text");  // PluginData.plugin_name
  std::string metadata;
  LengthDelimited(metadata, 1, plugin_data);  // SummaryMetadata.plugin_data
  std::string dim;
  Varint(dim, (1 << 3) | 0);  // TensorShapeProto.Dim.size
  Varint(dim, texts.size());
  std::string shape;
  LengthDelimited(shape, 2, dim);  // TensorShapeProto.dim
  std::string tensor;
  Varint(tensor, (1 << 3) | 0);       // TensorProto.dtype
  Varint(tensor, 7);                  // DT_STRING
  LengthDelimited(tensor, 2, shape);  // TensorProto.tensor_shape
  for (const std::string& text : texts) LengthDelimited(tensor, 8, text);  // .string_val
  std::string value;
  LengthDelimited(value, 1, tag);
  LengthDelimited(value, 9, metadata);
  LengthDelimited(value, 8, tensor);
  return value;
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

  // TensorBoard's readers (EventAccumulator, plugin_event_accumulator) purge every event of a
  // step >= a SessionLog START's step once the file version is "brain.Event:2"; the plugin one
  // ignores a run's first START, so every run writes one (the first run's purges nothing).
  // tensorboard's Rust data server drops a tag's records at or after a step that arrives again.
  absl::Status StartRun(int64_t resumed_after) override {
    std::string session_log;
    Varint(session_log, (1 << 3) | 0);  // SessionLog.status
    Varint(session_log, 1);             // START
    const double now = static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6;
    std::string event = EventHeader(now, resumed_after > 0 ? resumed_after + 1 : 0);
    LengthDelimited(event, 7, session_log);  // Event.session_log
    return Record(event);
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
    for (const bool validation : {false, true}) {
      std::vector<std::string> texts;
      for (const v1::ResponseSample& sample : step.samples()) {
        if (sample.validation() == validation) texts.push_back(SampleMarkdown(sample));
      }
      if (!texts.empty()) {
        LengthDelimited(summary, 1, TextValue(validation ? "samples/val" : "samples/train", texts));
      }
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
      const std::string metrics = dir + "/metrics.jsonl";
      const std::string samples = dir + "/samples.jsonl";
      ASSIGN_OR_RETURN(AppendFile metrics_file, AppendFile::Open(metrics));
      ASSIGN_OR_RETURN(AppendFile samples_file, AppendFile::Open(samples));
      sinks.push_back(std::make_unique<JsonlSink>(
          JsonlSink::File{.path = metrics, .file = std::move(metrics_file)},
          JsonlSink::File{.path = samples, .file = std::move(samples_file)}));
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

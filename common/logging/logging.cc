// Implementation of the logging facade: one write(2) per line keeps concurrent lines whole.
#include "absl/strings/string_view.h"
#include "common/logging/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rlhfd::logging {
namespace {

std::atomic<int> g_min_severity{static_cast<int>(Severity::kInfo)};

std::mutex& ProcessNameMutex() {
  static std::mutex mutex;
  return mutex;
}
std::string& ProcessNameStorage() {
  static std::string name = "rlhfd";
  return name;
}

char SeverityLetter(Severity severity) {
  switch (severity) {
    case Severity::kDebug: return 'D';
    case Severity::kInfo: return 'I';
    case Severity::kWarning: return 'W';
    case Severity::kError: return 'E';
  }
  return '?';
}

thread_local LogContext t_context;

}  // namespace

ScopedLogContext::ScopedLogContext(LogContext context) : previous_(std::move(t_context)) {
  t_context = std::move(context);
}

ScopedLogContext::~ScopedLogContext() { t_context = std::move(previous_); }

const LogContext& CurrentLogContext() { return t_context; }

void SetMinSeverity(Severity severity) { g_min_severity = static_cast<int>(severity); }
Severity MinSeverity() { return static_cast<Severity>(g_min_severity.load()); }

bool ParseSeverity(absl::string_view text, Severity* severity) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") *severity = Severity::kDebug;
  else if (lower == "info") *severity = Severity::kInfo;
  else if (lower == "warning") *severity = Severity::kWarning;
  else if (lower == "error") *severity = Severity::kError;
  else return false;
  return true;
}

void SetProcessName(std::string name) {
  std::lock_guard<std::mutex> lock(ProcessNameMutex());
  ProcessNameStorage() = std::move(name);
}

LogLine::LogLine(Severity severity, const char* file, int line) : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  std::string process;
  {
    std::lock_guard<std::mutex> lock(ProcessNameMutex());
    process = ProcessNameStorage();
  }
  stream_ << SeverityLetter(severity) << ' '
          << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()) << ' '
          << process << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
  const LogContext& context = t_context;
  if (!context.job.empty() || !context.role.empty() || context.rank >= 0 || context.step >= 0) {
    std::string fields;
    const auto add = [&fields](absl::string_view name, const std::string& value) {
      absl::StrAppend(&fields, fields.empty() ? "" : " ", name, "=", value);
    };
    if (!context.job.empty()) add("job", context.job);
    if (!context.role.empty()) add("role", context.role);
    if (context.rank >= 0) add("rank", std::to_string(context.rank));
    if (context.step >= 0) add("step", std::to_string(context.step));
    stream_ << '[' << fields << "] ";
  }
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // A single write keeps concurrent lines from interleaving.
  [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
}

bool ShouldLogEvery(std::atomic<int64_t>* last_ns, double seconds) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_ns->load();
  if (last != 0 && now - last < static_cast<int64_t>(seconds * 1e9)) return false;
  return last_ns->compare_exchange_strong(last, now);
}

}  // namespace rlhfd::logging

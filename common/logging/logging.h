// The logging facade of every rlhfd process: leveled, timestamped lines on stderr with optional
// structured fields (job, role, rank, step), and a rate-limited variant for hot loops.
#pragma once

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include "absl/strings/string_view.h"

namespace rlhfd::logging {

enum class Severity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Process-wide threshold; lines below it are dropped. Set once by main() from --log_level.
void SetMinSeverity(Severity severity);
Severity MinSeverity();
// Parses "debug", "info", "warning", "error"; returns false for anything else.
bool ParseSeverity(absl::string_view text, Severity* severity);
// Name of this process in every line, e.g. "controller" or "worker/host-cuda0".
void SetProcessName(std::string name);

// Collects one line and writes it atomically on destruction.
class LogLine {
 public:
  LogLine(Severity severity, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  Severity severity_;
  std::ostringstream stream_;
};

// Turns a streamed LogLine into void, so LOG(...) is one expression (no dangling else).
struct Voidify {
  void operator&(const LogLine&) {}
};

// True once every `seconds` per call site; `last_ns` is that call site's state.
bool ShouldLogEvery(std::atomic<int64_t>* last_ns, double seconds);

}  // namespace rlhfd::logging

#define RLHFD_LOG_SEVERITY_DEBUG ::rlhfd::logging::Severity::kDebug
#define RLHFD_LOG_SEVERITY_INFO ::rlhfd::logging::Severity::kInfo
#define RLHFD_LOG_SEVERITY_WARNING ::rlhfd::logging::Severity::kWarning
#define RLHFD_LOG_SEVERITY_ERROR ::rlhfd::logging::Severity::kError

// LOG(INFO) << "worker " << id << " registered";
#define LOG(level)                                                             \
  !(RLHFD_LOG_SEVERITY_##level >= ::rlhfd::logging::MinSeverity())             \
      ? (void)0                                                                \
      : ::rlhfd::logging::Voidify() &                                          \
            ::rlhfd::logging::LogLine(RLHFD_LOG_SEVERITY_##level, __FILE__, __LINE__)

// At most one line per `seconds` from this call site (each expansion has its own state).
#define LOG_EVERY_N_SEC(level, seconds)                                                    \
  !(RLHFD_LOG_SEVERITY_##level >= ::rlhfd::logging::MinSeverity() &&                       \
    ::rlhfd::logging::ShouldLogEvery(                                                      \
        &[]() -> std::atomic<int64_t>& {                                                   \
          static std::atomic<int64_t> last_ns{0};                                          \
          return last_ns;                                                                  \
        }(),                                                                               \
        seconds))                                                                          \
      ? (void)0                                                                            \
      : ::rlhfd::logging::Voidify() &                                                      \
            ::rlhfd::logging::LogLine(RLHFD_LOG_SEVERITY_##level, __FILE__, __LINE__)

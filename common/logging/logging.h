// The logging facade of every rlhfd process: leveled, timestamped lines on stderr with the
// structured fields (job, role, rank, step) of the work in hand, and a rate-limited variant for
// hot loops. The macros are RLOG / RLOG_EVERY_N_SEC, not LOG: LibTorch defines its own LOG, and
// worker files include both.
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

// The work a thread is doing, printed in each of its lines as "[job=job-3 role=actor rank=1
// step=7]"; empty fields are left out.
struct LogContext {
  std::string job;
  std::string role;
  int rank = -1;
  int64_t step = -1;
};

// Sets this thread's context for its lifetime and restores the previous one after, so a task
// or an RPC handler names its job in every line it logs.
class ScopedLogContext {
 public:
  explicit ScopedLogContext(LogContext context);
  ~ScopedLogContext();
  ScopedLogContext(const ScopedLogContext&) = delete;
  ScopedLogContext& operator=(const ScopedLogContext&) = delete;

 private:
  LogContext previous_;
};

// This thread's current context.
const LogContext& CurrentLogContext();

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

// RLOG(INFO) << "worker " << id << " registered";
#define RLOG(level)                                                             \
  !(RLHFD_LOG_SEVERITY_##level >= ::rlhfd::logging::MinSeverity())             \
      ? (void)0                                                                \
      : ::rlhfd::logging::Voidify() &                                          \
            ::rlhfd::logging::LogLine(RLHFD_LOG_SEVERITY_##level, __FILE__, __LINE__)

// At most one line per `seconds` from this call site (each expansion has its own state).
#define RLOG_EVERY_N_SEC(level, seconds)                                                    \
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

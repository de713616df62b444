// Subprocess: a child process for integration tests, with its output captured to a file and a
// kill on destruction, so a failing test never leaves daemons behind.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rlhfd::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_path`.
  Subprocess(std::vector<std::string> argv, std::string log_path);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Sends `signal` and waits up to `timeout` for exit; returns the exit status (or 128+signal),
  // nullopt if it did not exit in time.
  std::optional<int> Stop(int signal, absl::Duration timeout);
  // Waits for exit without signalling.
  std::optional<int> Wait(absl::Duration timeout);
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  std::string log_path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a command to completion (at most `timeout`), capturing stdout and stderr; in `cwd` when
// given.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(30), const std::string& cwd = "");

// Polls `condition` every 50 ms until it holds or `timeout` passes.
template <typename Condition>
bool WaitFor(Condition condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return condition();
}

// A loopback TCP port nothing listens on right now (for a server a test is about to start).
int FreeLoopbackPort();

// A fresh empty directory under $TMPDIR, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace rlhfd::testing

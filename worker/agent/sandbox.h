// The code interpreter's sandbox for multi-turn tool calls ([agentic]): each call's Python code
// runs in a process of its own that sees no network, no files but the interpreter's read-only
// runtime and an empty scratch directory, and no other process, under limits on CPU time,
// memory, processes, file size and output, with a wall-clock deadline. Whatever the code does,
// the worker gets a result (its output, or what stopped it) and keeps nothing of the call.
//
// How: the worker starts rlhfd-sandbox (posix_spawn: no copy of the worker's memory), which
// clones the sandbox's first process into new user, mount, PID, network, IPC and UTS
// namespaces as the worker's child, writes its id maps and exits (sandbox_child.h). The code
// runs as id 65534 of its user namespace, mapped onto nobody for a root worker and onto the
// worker's own ids otherwise: it holds no capability once Python starts, and RLIMIT_NPROC counts
// the sandbox's processes alone (the count is per namespace).
// The mount namespace pivots into a tmpfs root holding read-only binds of the runtime (/usr and
// the /bin, /lib... links or binds beside it, plus options.read_only_paths), /dev's null, zero,
// random and urandom, and a size-limited tmpfs at /work (the scratch: cwd, HOME, TMPDIR). The
// network namespace has only a loopback that is down. The namespace's first process (PID 1,
// this library's code) starts Python as its child and reports how it ended; when it exits, or is
// killed (SIGKILL at the deadline, once the output passes its cap, or when the worker dies), the
// kernel ends every process the code started, and the tmpfs mounts go with the namespace, so no
// process or file outlives a call. Processes start ahead of their call (a warm pool): a call
// takes one that is already waiting for code, and starts its replacement.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rlhfd::agent {

struct SandboxPlan;    // sandbox_child.h
struct SandboxReport;  // sandbox_child.h

struct SandboxLimits {
  absl::Duration wall_time = absl::Seconds(10);  // from the call to the process's end
  int64_t cpu_seconds = 10;                      // RLIMIT_CPU, per process
  int64_t memory_mb = 1024;                      // RLIMIT_AS, per process
  int64_t processes = 16;                        // RLIMIT_NPROC, in the sandbox's namespace
  int64_t scratch_mb = 64;                       // the /work tmpfs
  int64_t file_mb = 64;                          // RLIMIT_FSIZE
  int64_t open_files = 64;                       // RLIMIT_NOFILE
  int64_t output_bytes = 64 * 1024;  // stdout + stderr kept; the process is killed past it
};

struct SandboxOptions {
  // rlhfd-sandbox, the program that starts each sandboxed process; "" means the one installed
  // beside the running executable (SandboxLauncherPath()).
  std::string launcher;
  // The interpreter, an absolute path under one of the read-only paths.
  std::string python = "/usr/bin/python3";
  // Bound read-only at the same path inside (besides /usr and the root's links into it): a
  // virtual environment with the packages the tool's code may import, say.
  std::vector<std::string> read_only_paths;
  SandboxLimits limits;
  int warm_processes = 2;  // started ahead of calls
};

struct SandboxResult {
  std::string stdout_text;
  std::string stderr_text;
  // Python's exit status, or the signal that ended it (exit_code -1): SIGKILL with timed_out or
  // output_truncated when this side stopped it, SIGXCPU at the CPU limit.
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;         // the wall-clock deadline passed
  bool output_truncated = false;  // the output passed limits.output_bytes
  absl::Duration wall_time;
  absl::Duration cpu_time;  // Python's and its reaped children's, when it ended by itself
};

class Sandbox {
 public:
  // Checks the options (INVALID_ARGUMENT naming the field) and starts the warm processes;
  // FAILED_PRECONDITION, with the step and errno, where this host cannot make the namespaces.
  static absl::StatusOr<std::unique_ptr<Sandbox>> Create(SandboxOptions options);
  // Kills the waiting processes.
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Runs `code` as a Python program in a fresh process. Whatever the code does is a result;
  // an error only when no sandboxed process could be made (FAILED_PRECONDITION) or the code is
  // too large to hand over (INVALID_ARGUMENT). Safe from several threads: each call has its own
  // process.
  absl::StatusOr<SandboxResult> Run(const std::string& code);

 private:
  struct Process {
    pid_t pid = -1;
    int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;
    int report_fd = -1;  // SandboxReports: setup failed, ready, Python ended
  };
  explicit Sandbox(SandboxOptions options);
  // Starts rlhfd-sandbox and returns its first process, whose next report says whether Python
  // runs.
  absl::StatusOr<Process> Start() const;
  // A kSetupFailed report in words.
  absl::Status SetupError(const SandboxReport& report) const;
  // A process whose Python is waiting for code: a warm one, else a new one.
  absl::StatusOr<Process> TakeReady();
  static void Discard(Process& process);

  SandboxOptions options_;  // options_.launcher resolved
  std::unique_ptr<const SandboxPlan> plan_;
  int plan_fd_ = -1;  // the plan encoded in a sealed memfd, rlhfd-sandbox's kPlanFd
  // The write end is held by the worker alone (close-on-exec); each sandbox's first process
  // watches the read end and ends its sandbox when the worker is gone.
  int life_pipe_[2] = {-1, -1};
  std::mutex mutex_;
  std::deque<Process> warm_;
  int starting_ = 0;  // replacements being started
};

// rlhfd-sandbox beside the running executable (the build tree's worker/ and an install's or a
// bundle's bin/); "" when it is not there.
std::string SandboxLauncherPath();

}  // namespace rlhfd::agent

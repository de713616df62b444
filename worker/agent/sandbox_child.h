// The sandbox's first process (worker/agent/sandbox.h): the plan it follows, what it reports,
// and its code. It runs in a child cloned from the threaded worker and never execs, so it
// allocates nothing and calls the kernel directly (docs/internals/agent.md, "Why raw system
// calls").
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rlhfd::agent {

// The id the code runs as, inside its namespace and (for a root worker) outside: nobody.
inline constexpr int kSandboxId = 65534;

// What the first process does to build the root, in order. Paths are absolute on the host: the
// root's mount point joined with the path inside. Built once per Sandbox, before any clone.
struct SandboxPlan {
  enum Kind { kDir, kSymlink, kBindReadOnly, kBindDevice, kTmpfs };
  struct Entry {
    Kind kind;
    std::string source;  // kSymlink: the link's text; kBind*: the host path; kTmpfs: options
    std::string target;
    std::string inside;  // the path inside, for messages
  };
  std::string root;  // the empty host directory the root tmpfs is mounted on
  std::vector<Entry> entries;
  std::vector<std::string> argv_text;
  std::vector<std::string> env_text;
  std::vector<char*> argv;
  std::vector<char*> env;
  std::vector<std::pair<int, rlim_t>> limits;
};

// What the first process tells the worker: its setup failed (the step, the entry, errno),
// Python runs, or Python ended (its wait status and CPU time).
struct SandboxReport {
  enum Kind : int { kSetupFailed = 1, kReady, kExited };
  int kind = 0;
  int step = 0;
  int entry = -1;
  int value = 0;  // kSetupFailed: errno; kExited: the wait status
  int64_t cpu_ms = 0;
};

// The setup step a kSetupFailed report names, in words.
const char* SandboxStepName(int step);

// The first process's whole life: waits for its id maps on `sync_fd`, builds the root, starts
// Python on the given stdin/stdout/stderr, reports on `report_fd`, and exits when Python has
// ended or `life_fd` hangs up (the worker is gone).
[[noreturn]] void RunSandboxFirstProcess(const SandboxPlan& plan, int sync_fd, int life_fd,
                                         int stdin_fd, int stdout_fd, int stderr_fd, int report_fd);

}  // namespace rlhfd::agent

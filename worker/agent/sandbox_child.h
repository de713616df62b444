// The sandbox's side of a call (worker/agent/sandbox.h): the plan the worker hands over, what
// the sandbox reports back, and the code of rlhfd-sandbox (worker/tools/rlhfd_sandbox.cc), the
// small program the worker starts for each sandboxed process. The worker never clones itself:
// a clone copies the caller's page tables, about 40 ms per GB a GPU worker holds, so it starts
// rlhfd-sandbox with posix_spawn (no copy) and the namespaces are cloned from that small process
// (docs/internals/agent.md, "Why a launcher").
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlhfd::agent {

// The id the code runs as, inside its namespace and (for a root worker) outside: nobody.
inline constexpr int kSandboxId = 65534;

// The descriptors rlhfd-sandbox starts with (0-2 are /dev/null); the worker places them.
enum SandboxFd : int {
  kPlanFd = 3,  // the encoded SandboxPlan, a sealed memfd read with pread
  kLifeFd,      // hangs up when the worker is gone
  kStdinFd,     // Python's stdin, stdout and stderr
  kStdoutFd,
  kStderrFd,
  kReportFd,     // SandboxReports to the worker
  kFirstFreeFd,  // the first descriptor rlhfd-sandbox does not start with
};

// What the first process does to build the root, in order, and what it then runs. Paths are
// absolute on the host: the root's mount point joined with the path inside. Built once per
// Sandbox.
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
  std::vector<std::string> argv;  // Python's command line, argv[0] its path
  std::vector<std::string> env;
  std::vector<std::pair<int, rlim_t>> limits;
};

// The plan as bytes for kPlanFd, and back; nullopt for bytes that are not an encoded plan.
std::string EncodeSandboxPlan(const SandboxPlan& plan);
std::optional<SandboxPlan> DecodeSandboxPlan(std::string_view bytes);

// What rlhfd-sandbox tells the worker, in order: the first process's pid (kStarted), then
// either that its setup failed (the step, the entry, errno) or that Python runs (kReady), then
// that Python ended (its wait status and CPU time).
struct SandboxReport {
  enum Kind : int { kSetupFailed = 1, kStarted, kReady, kExited };
  int kind = 0;
  int step = 0;
  int entry = -1;
  int value = 0;  // kStarted: the pid; kSetupFailed: errno; kExited: the wait status
  int64_t cpu_ms = 0;
};

// The setup step a kSetupFailed report names, in words.
const char* SandboxStepName(int step);

// rlhfd-sandbox's whole run, started with the SandboxFd descriptors: reads the plan, clones the
// namespaces' first process as a child of the worker (CLONE_PARENT), reports its pid, writes its
// id maps and releases it. The first process builds the root, starts Python, reports, and
// exits when Python has ended or the worker is gone. Returns the launcher's exit status.
int RunSandboxLauncher();

}  // namespace rlhfd::agent

#include "worker/agent/sandbox_child.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <iterator>

namespace rlhfd::agent {
namespace {

// mount_setattr(2) (Linux 5.12): <linux/mount.h> clashes with <sys/mount.h> under glibc 2.36,
// so the few names it needs are spelled here.
struct MountAttributes {
  uint64_t attr_set;
  uint64_t attr_clr;
  uint64_t propagation;
  uint64_t userns_fd;
};
constexpr uint64_t kMountReadOnly = 0x1, kMountNoSuid = 0x2, kMountNoDev = 0x4;
constexpr unsigned int kAtRecursive = 0x8000;

enum Step : int {
  kWaitForMaps = 1,
  kIds,
  kPrivateMounts,
  kRootTmpfs,
  kEntry,
  kPivot,
  kReadOnlyRoot,
  kWorkDir,
  kLimits,
  kStdio,
  kExec,
};
}  // namespace

const char* SandboxStepName(int step) {
  switch (step) {
    case kWaitForMaps:
      return "waiting for the id maps";
    case kIds:
      return "taking the sandbox's user and group ids";
    case kPrivateMounts:
      return "making the mounts private";
    case kRootTmpfs:
      return "mounting the root tmpfs";
    case kEntry:
      return "building the root";
    case kPivot:
      return "pivot_root";
    case kReadOnlyRoot:
      return "remounting the root read-only";
    case kWorkDir:
      return "entering /work";
    case kLimits:
      return "setting the rlimits";
    case kStdio:
      return "setting up stdin, stdout and stderr";
    case kExec:
      return "executing the interpreter";
    default:
      return "setup";
  }
}

namespace {

// The child, forked from a threaded process: system calls only, no allocation.
[[noreturn]] void Fail(int report_fd, int step, int entry = -1) {
  const SandboxReport report{
      .kind = SandboxReport::kSetupFailed, .step = step, .entry = entry, .value = errno};
  (void)!::write(report_fd, &report, sizeof(report));
  ::_exit(127);
}

int CreateEmptyFile(const char* path) {
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  ::close(fd);
  return 0;
}

}  // namespace

// PID 1 of the sandbox's namespaces. When it exits, the kernel ends whatever Python left there.
[[noreturn]] void RunSandboxFirstProcess(const SandboxPlan& plan, int sync_fd, int life_fd,
                                         int stdin_fd, int stdout_fd, int stderr_fd,
                                         int report_fd) {
  // The worker's signal handlers are not this process's: a PID 1 takes, from inside its
  // namespace, only the signals it handles, and Python could send it any the worker handles.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal = 1; signal < NSIG; ++signal) ::sigaction(signal, &default_action, nullptr);
  // Its own ends above 0-2 (a worker may run with those closed), so that the dup2s onto 0-2
  // below cannot overwrite one of them.
  int* ends[] = {&sync_fd, &life_fd, &stdin_fd, &stdout_fd, &stderr_fd, &report_fd};
  for (int* end : ends) {
    if (*end < 3) *end = ::fcntl(*end, F_DUPFD_CLOEXEC, 3);
  }
  // This process never execs, so close-on-exec does not apply: everything it inherited but its
  // own six ends is closed, or it would hold other sandboxes' pipes open and their EOFs back.
  int keep[] = {sync_fd, life_fd, stdin_fd, stdout_fd, stderr_fd, report_fd};
  std::sort(std::begin(keep), std::end(keep));
  unsigned int next = 3;
  for (const int fd : keep) {
    if (static_cast<unsigned int>(fd) > next) ::syscall(SYS_close_range, next, fd - 1U, 0U);
    next = std::max(next, fd + 1U);
  }
  ::syscall(SYS_close_range, next, ~0U, 0U);
  char byte = 0;
  if (::read(sync_fd, &byte, 1) != 1) Fail(report_fd, kWaitForMaps);
  // The clone kept the worker's ids, which a root worker's map leaves unmapped here (files made
  // by an unmapped id fail with EOVERFLOW): take the mapped one, keeping the namespace's
  // capabilities for the setup (execve drops them, the id not being 0).
  // Raw system calls: glibc's set*id wrappers signal every thread the worker had, which this
  // process, alone, would wait for forever.
  ::prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
  (void)::syscall(SYS_setgroups, 0, nullptr);  // denied, and not needed, for a non-root worker
  if (::syscall(SYS_setresgid, kSandboxId, kSandboxId, kSandboxId) != 0 ||
      ::syscall(SYS_setresuid, kSandboxId, kSandboxId, kSandboxId) != 0) {
    Fail(report_fd, kIds);
  }
  __user_cap_header_struct header{.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  __user_cap_data_struct caps[2] = {};
  if (::syscall(SYS_capget, &header, caps) != 0) Fail(report_fd, kIds);
  for (__user_cap_data_struct& part : caps) part.effective = part.permitted;
  if (::syscall(SYS_capset, &header, caps) != 0) Fail(report_fd, kIds);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    Fail(report_fd, kPrivateMounts);
  }
  if (::mount("tmpfs", plan.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") !=
      0) {
    Fail(report_fd, kRootTmpfs);
  }
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const SandboxPlan::Entry& entry = plan.entries[i];
    const char* target = entry.target.c_str();
    int done = 0;
    switch (entry.kind) {
      case SandboxPlan::kDir:
        done = ::mkdir(target, 0755) == 0 || errno == EEXIST ? 0 : -1;
        break;
      case SandboxPlan::kSymlink:
        done = ::symlink(entry.source.c_str(), target);
        break;
      case SandboxPlan::kBindReadOnly: {
        done = ::mount(entry.source.c_str(), target, nullptr, MS_BIND | MS_REC, nullptr);
        // Read-only all the way down: a remount would reach the top mount only, and leave any
        // mount below the path (a writable tmpfs under it, say) writable.
        MountAttributes attributes{.attr_set = kMountReadOnly | kMountNoSuid | kMountNoDev,
                                   .attr_clr = 0,
                                   .propagation = 0,
                                   .userns_fd = 0};
        if (done == 0) {
          done = static_cast<int>(::syscall(SYS_mount_setattr, AT_FDCWD, target, kAtRecursive,
                                            &attributes, sizeof(attributes)));
        }
        break;
      }
      case SandboxPlan::kBindDevice:
        done = CreateEmptyFile(target);
        if (done == 0) done = ::mount(entry.source.c_str(), target, nullptr, MS_BIND, nullptr);
        break;
      case SandboxPlan::kTmpfs:
        done = ::mkdir(target, 0700);
        if (done == 0) {
          done = ::mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, entry.source.c_str());
        }
        break;
    }
    if (done != 0) Fail(report_fd, kEntry, static_cast<int>(i));
  }
  if (::chdir(plan.root.c_str()) != 0 || ::syscall(SYS_pivot_root, ".", ".") != 0 ||
      ::umount2(".", MNT_DETACH) != 0 || ::chdir("/") != 0) {
    Fail(report_fd, kPivot);
  }
  if (::mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
              nullptr) != 0) {
    Fail(report_fd, kReadOnlyRoot);
  }
  if (::chdir("/work") != 0) Fail(report_fd, kWorkDir);

  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) Fail(report_fd, kExec);
  // A raw fork: glibc's runs the worker's fork handlers, whose locks other threads may hold.
  const pid_t python =
      static_cast<pid_t>(::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, nullptr));
  if (python < 0) Fail(report_fd, kExec);
  if (python == 0) {
    for (const auto& [resource, value] : plan.limits) {
      // RLIMIT_CPU: SIGXCPU at the limit, SIGKILL a second on.
      const struct rlimit limit {
        .rlim_cur = value, .rlim_max = resource == RLIMIT_CPU ? value + 1 : value
      };
      if (::setrlimit(resource, &limit) != 0) Fail(exec_pipe[1], kLimits);
    }
    if (::dup2(stdin_fd, 0) < 0 || ::dup2(stdout_fd, 1) < 0 || ::dup2(stderr_fd, 2) < 0) {
      Fail(exec_pipe[1], kStdio);
    }
    // Everything else closes at exec, the exec pipe too (its EOF: Python runs).
    ::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    ::execve(plan.argv[0], plan.argv.data(), plan.env.data());
    Fail(exec_pipe[1], kExec);
  }
  // Only Python holds its stdin, stdout and stderr: their EOFs are its.
  ::close(stdin_fd);
  ::close(stdout_fd);
  ::close(stderr_fd);
  ::close(exec_pipe[1]);
  SandboxReport report{};
  if (::read(exec_pipe[0], &report, sizeof(report)) == static_cast<ssize_t>(sizeof(report))) {
    (void)!::write(report_fd, &report, sizeof(report));
    ::_exit(127);
  }
  report = SandboxReport{.kind = SandboxReport::kReady};
  if (::write(report_fd, &report, sizeof(report)) != static_cast<ssize_t>(sizeof(report))) {
    ::_exit(127);
  }
  const int python_fd = static_cast<int>(::syscall(SYS_pidfd_open, python, 0));
  while (true) {
    pollfd fds[2] = {{.fd = life_fd, .events = POLLIN, .revents = 0},
                     {.fd = python_fd, .events = POLLIN, .revents = 0}};
    ::poll(fds, 2, python_fd < 0 ? 20 : -1);
    if (fds[0].revents != 0) ::_exit(0);  // the worker is gone
    int status = 0;
    rusage usage{};
    if (::wait4(python, &status, WNOHANG, &usage) == python) {
      report =
          SandboxReport{.kind = SandboxReport::kExited,
                        .value = status,
                        .cpu_ms = usage.ru_utime.tv_sec * 1000 + usage.ru_utime.tv_usec / 1000 +
                                  usage.ru_stime.tv_sec * 1000 + usage.ru_stime.tv_usec / 1000};
      (void)!::write(report_fd, &report, sizeof(report));
      ::_exit(0);
    }
  }
}

}  // namespace rlhfd::agent

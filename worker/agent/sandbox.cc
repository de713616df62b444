#include "worker/agent/sandbox.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rlhfd::agent {
namespace {

// Python's side: reads the whole program from stdin, then runs it as __main__; a traceback
// shows the code's frames only.
constexpr char kRunner[] = R"(import sys
source = sys.stdin.buffer.read()
sys.stdin.close()
sys.argv = ["<tool>"]
try:
    exec(compile(source, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException:
    import traceback
    kind, value, frames = sys.exc_info()
    traceback.print_exception(kind, value, frames.tb_next)
    sys.exit(1)
)";
// The code's size limit: it travels through a socket buffer into the process's memory.
constexpr size_t kMaxCodeBytes = 1 << 20;
// The id the code runs as, inside its namespace and (for a root worker) outside: nobody.
constexpr int kSandboxId = 65534;

// What the sandbox's first process tells the worker: its setup failed (the step, the entry,
// errno), Python runs, or Python ended (its wait status and CPU time).
struct Report {
  enum Kind : int { kSetupFailed = 1, kReady, kExited };
  int kind = 0;
  int step = 0;
  int entry = -1;
  int value = 0;  // kSetupFailed: errno; kExited: the wait status
  int64_t cpu_ms = 0;
};
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
const char* StepName(int step) {
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

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

// One thing the child does to its new root. Paths are absolute on the host: the root's
// mount point joined with the path inside.
struct Sandbox::Plan {
  enum Kind { kDir, kSymlink, kBindReadOnly, kBindDevice, kTmpfs };
  struct Entry {
    Kind kind;
    std::string source;  // kSymlink: the link's text; kBind*: the host path; kTmpfs: options
    std::string target;
    std::string inside;               // the path inside, for messages
    unsigned long remount_flags = 0;  // kBindReadOnly: the source's locked flags, kept
  };
  std::string root;  // the empty host directory the root tmpfs is mounted on
  std::vector<Entry> entries;
  std::vector<std::string> argv_text;
  std::vector<std::string> env_text;
  std::vector<char*> argv;
  std::vector<char*> env;
  std::vector<std::pair<int, rlim_t>> limits;
};

namespace {

// Mount flags a bind of `path` must keep when remounted (the kernel refuses to clear flags
// the original mount locked in a user namespace) plus read-only.
unsigned long RemountFlags(const std::string& path) {
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV;
  struct statvfs info {};
  if (::statvfs(path.c_str(), &info) != 0) return flags;
  if (info.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (info.f_flag & ST_NOATIME) flags |= MS_NOATIME;
  if (info.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
  if (info.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  return flags;
}

// The child, forked from a threaded process: system calls only, no allocation.
[[noreturn]] void Fail(int report_fd, int step, int entry = -1) {
  const Report report{.kind = Report::kSetupFailed, .step = step, .entry = entry, .value = errno};
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

// The sandbox's first process (PID 1 of its namespace), cloned from a threaded process: system
// calls only, no allocation. It builds the root, starts Python as its child, reports "ready"
// once Python is exec'd, and Python's wait status when it ends; then it exits, and the kernel
// ends whatever Python left in the namespace. It also exits when the worker does (`life_fd`
// hangs up), so no sandbox outlives its worker.
// clang-format off
[[noreturn]] static void ChildMain(const Sandbox::Plan& plan, int sync_fd, int life_fd,
                                   int stdin_fd, int stdout_fd, int stderr_fd, int report_fd) {
  // clang-format on
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
    const Sandbox::Plan::Entry& entry = plan.entries[i];
    const char* target = entry.target.c_str();
    int done = 0;
    switch (entry.kind) {
      case Sandbox::Plan::kDir:
        done = ::mkdir(target, 0755) == 0 || errno == EEXIST ? 0 : -1;
        break;
      case Sandbox::Plan::kSymlink:
        done = ::symlink(entry.source.c_str(), target);
        break;
      case Sandbox::Plan::kBindReadOnly:
        done = ::mount(entry.source.c_str(), target, nullptr, MS_BIND | MS_REC, nullptr);
        if (done == 0) done = ::mount(nullptr, target, nullptr, entry.remount_flags, nullptr);
        break;
      case Sandbox::Plan::kBindDevice:
        done = CreateEmptyFile(target);
        if (done == 0) done = ::mount(entry.source.c_str(), target, nullptr, MS_BIND, nullptr);
        break;
      case Sandbox::Plan::kTmpfs:
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
  Report report{};
  if (::read(exec_pipe[0], &report, sizeof(report)) == static_cast<ssize_t>(sizeof(report))) {
    (void)!::write(report_fd, &report, sizeof(report));
    ::_exit(127);
  }
  report = Report{.kind = Report::kReady};
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
      report = Report{.kind = Report::kExited,
                      .value = status,
                      .cpu_ms = usage.ru_utime.tv_sec * 1000 + usage.ru_utime.tv_usec / 1000 +
                                usage.ru_stime.tv_sec * 1000 + usage.ru_stime.tv_usec / 1000};
      (void)!::write(report_fd, &report, sizeof(report));
      ::_exit(0);
    }
  }
}

Sandbox::Sandbox(SandboxOptions options) : options_(std::move(options)) {}

Sandbox::~Sandbox() {
  for (Process& process : warm_) Discard(process);
  for (int& fd : life_pipe_) CloseFd(fd);
  if (plan_ != nullptr) ::rmdir(plan_->root.c_str());
}

void Sandbox::Discard(Process& process) {
  // Each of these ends its namespace with it.
  if (process.pid > 0) {
    ::kill(process.pid, SIGKILL);
    ::waitpid(process.pid, nullptr, 0);
  }
  process.pid = -1;
  CloseFd(process.stdin_fd);
  CloseFd(process.stdout_fd);
  CloseFd(process.stderr_fd);
  CloseFd(process.report_fd);
}

absl::StatusOr<std::unique_ptr<Sandbox>> Sandbox::Create(SandboxOptions options) {
  const SandboxLimits& limits = options.limits;
  const std::pair<const char*, int64_t> positive[] = {
      {"cpu_seconds", limits.cpu_seconds},   {"memory_mb", limits.memory_mb},
      {"processes", limits.processes},       {"scratch_mb", limits.scratch_mb},
      {"file_mb", limits.file_mb},           {"open_files", limits.open_files},
      {"output_bytes", limits.output_bytes},
  };
  for (const auto& [name, value] : positive) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sandbox limit ", name, " must be positive (got ", value, ")"));
    }
  }
  if (limits.wall_time <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("sandbox limit wall_time must be positive");
  }
  if (options.warm_processes < 0) {
    return absl::InvalidArgumentError("sandbox warm_processes must not be negative");
  }
  std::vector<std::string> read_only = {"/usr"};
  for (const std::string& path : options.read_only_paths) {
    if (path.empty() || path[0] != '/' || path == "/") {
      return absl::InvalidArgumentError(absl::StrCat("sandbox read_only_paths: '", path,
                                                     "' is not an absolute path below the root"));
    }
    std::error_code error;
    if (!std::filesystem::is_directory(path, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sandbox read_only_paths: '", path, "' is not a directory"));
    }
    read_only.push_back(std::filesystem::path(path).lexically_normal().string());
  }
  const std::string& python = options.python;
  const bool python_inside =
      !python.empty() && python[0] == '/' &&
      std::any_of(read_only.begin(), read_only.end(),
                  [&](const std::string& dir) { return python.rfind(dir + "/", 0) == 0; });
  if (!python_inside || ::access(python.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sandbox python '", python, "' must be an executable under ",
                     absl::StrJoin(read_only, ", "), " (the paths the sandbox can see)"));
  }

  auto plan = std::make_unique<Plan>();
  const char* temp = std::getenv("TMPDIR");
  std::string root_template =
      absl::StrCat(temp != nullptr && *temp != '\0' ? temp : "/tmp", "/rlhfd-sandbox-XXXXXX");
  if (::mkdtemp(root_template.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox: cannot make ", root_template, ": ", std::strerror(errno)));
  }
  plan->root = root_template;
  auto add = [&](Plan::Kind kind, std::string source, const std::string& inside,
                 unsigned long flags = 0) {
    plan->entries.push_back(Plan::Entry{.kind = kind,
                                        .source = std::move(source),
                                        .target = plan->root + inside,
                                        .inside = inside,
                                        .remount_flags = flags});
  };
  // The root's links into /usr (merged /usr) are links here too; real directories are bound.
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code error;
    const auto status = std::filesystem::symlink_status(top, error);
    if (error) continue;
    if (std::filesystem::is_symlink(status)) {
      add(Plan::kSymlink, std::filesystem::read_symlink(top, error).string(), top);
    } else if (std::filesystem::is_directory(status)) {
      read_only.push_back(top);
    }
  }
  for (const std::string& path : read_only) {
    std::string prefix;
    for (const auto& part : std::filesystem::path(path).relative_path()) {
      prefix += "/" + part.string();
      add(Plan::kDir, "", prefix);
    }
    add(Plan::kBindReadOnly, path, path, RemountFlags(path));
  }
  add(Plan::kDir, "", "/dev");
  for (const char* device : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}) {
    add(Plan::kBindDevice, device, device);
  }
  add(Plan::kTmpfs, absl::StrCat("size=", limits.scratch_mb, "m,mode=0700"), "/work");
  add(Plan::kSymlink, "/work", "/tmp");

  plan->argv_text = {python, "-I", "-u", "-c", kRunner, "rlhfd-sandbox"};
  plan->env_text = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/work", "TMPDIR=/work",
                    "LANG=C.UTF-8"};
  for (std::string& text : plan->argv_text) plan->argv.push_back(text.data());
  plan->argv.push_back(nullptr);
  for (std::string& text : plan->env_text) plan->env.push_back(text.data());
  plan->env.push_back(nullptr);
  auto mb = [](int64_t value) { return static_cast<rlim_t>(value) << 20; };
  plan->limits = {
      {RLIMIT_CPU, static_cast<rlim_t>(limits.cpu_seconds)},   {RLIMIT_AS, mb(limits.memory_mb)},
      {RLIMIT_NPROC, static_cast<rlim_t>(limits.processes)},   {RLIMIT_FSIZE, mb(limits.file_mb)},
      {RLIMIT_NOFILE, static_cast<rlim_t>(limits.open_files)}, {RLIMIT_CORE, 0},
  };

  std::unique_ptr<Sandbox> sandbox(new Sandbox(std::move(options)));
  sandbox->plan_ = std::move(plan);
  if (::pipe2(sandbox->life_pipe_, O_CLOEXEC) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox: cannot make a pipe: ", std::strerror(errno)));
  }
  // One process now, so that a host that cannot make the namespaces says so at once.
  absl::StatusOr<SandboxResult> probe = sandbox->Run("");
  if (!probe.ok()) return probe.status();
  if (probe->exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox: the interpreter ", sandbox->options_.python, " does not run inside (exit ",
        probe->exit_code, ", signal ", probe->signal, "): ", probe->stderr_text));
  }
  return sandbox;
}

absl::StatusOr<Sandbox::Process> Sandbox::Start() const {
  int stdin_pair[2], stdout_pipe[2], stderr_pipe[2], report_pipe[2], sync_pipe[2];
  int* all[] = {stdin_pair, stdout_pipe, stderr_pipe, report_pipe, sync_pipe};
  for (int* pair : all) pair[0] = pair[1] = -1;
  auto close_all = [&] {
    for (int* pair : all) {
      CloseFd(pair[0]);
      CloseFd(pair[1]);
    }
  };
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stdin_pair) != 0 ||
      ::pipe2(stdout_pipe, O_CLOEXEC) != 0 || ::pipe2(stderr_pipe, O_CLOEXEC) != 0 ||
      ::pipe2(report_pipe, O_CLOEXEC) != 0 || ::pipe2(sync_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    close_all();
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox: cannot make pipes: ", std::strerror(error)));
  }
  const long pid = ::syscall(SYS_clone,
                             CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET |
                                 CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD,
                             nullptr, nullptr, nullptr, nullptr);
  if (pid == 0) {
    ChildMain(*plan_, sync_pipe[0], life_pipe_[0], stdin_pair[1], stdout_pipe[1], stderr_pipe[1],
              report_pipe[1]);
  }
  if (pid < 0) {
    const int error = errno;
    close_all();
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox: cannot clone into new user, mount, PID and network namespaces: ",
        std::strerror(error),
        error == EPERM || error == ENOSPC ? " (are user namespaces enabled on this host?)" : ""));
  }
  Process process{.pid = static_cast<pid_t>(pid),
                  .stdin_fd = std::exchange(stdin_pair[0], -1),
                  .stdout_fd = std::exchange(stdout_pipe[0], -1),
                  .stderr_fd = std::exchange(stderr_pipe[0], -1),
                  .report_fd = std::exchange(report_pipe[0], -1)};
  // The id maps: a root worker maps the sandbox onto nobody, so that its processes are an
  // unprivileged user's (RLIMIT_NPROC holds); another maps it onto its own ids.
  const bool root = ::geteuid() == 0;
  const std::string uid_map =
      absl::StrCat(kSandboxId, " ", root ? kSandboxId : static_cast<int>(::geteuid()), " 1\n");
  const std::string gid_map =
      absl::StrCat(kSandboxId, " ", root ? kSandboxId : static_cast<int>(::getegid()), " 1\n");
  auto write_file = [&](const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat("/proc/", pid, "/", name);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    return written;
  };
  const bool mapped = (root || write_file("setgroups", "deny")) && write_file("uid_map", uid_map) &&
                      write_file("gid_map", gid_map);
  const int map_error = errno;
  const bool released = mapped && ::write(sync_pipe[1], "g", 1) == 1;
  close_all();
  if (!released) {
    Discard(process);
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox: cannot write the id maps of the sandbox process: ", std::strerror(map_error)));
  }
  return process;
}

absl::StatusOr<Sandbox::Process> Sandbox::TakeReady() {
  for (int attempt = 0;; ++attempt) {
    Process process;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!warm_.empty()) {
        process = warm_.front();
        warm_.pop_front();
      }
    }
    const bool was_warm = process.pid > 0;
    if (!was_warm) {
      absl::StatusOr<Process> started = Start();
      if (!started.ok()) return started.status();
      process = *started;
    }
    // The first report: Python runs, or what failed on the way.
    Report report{};
    ssize_t got = 0;
    do {
      got = ::read(process.report_fd, &report, sizeof(report));
    } while (got < 0 && errno == EINTR);
    if (got == static_cast<ssize_t>(sizeof(report)) && report.kind == Report::kReady) {
      return process;
    }
    Discard(process);
    if (got == static_cast<ssize_t>(sizeof(report)) && report.kind == Report::kSetupFailed) {
      const std::string where =
          report.entry >= 0 && report.entry < static_cast<int>(plan_->entries.size())
              ? absl::StrCat(" (", plan_->entries[report.entry].inside, ")")
              : "";
      return absl::FailedPreconditionError(absl::StrCat("sandbox: setup failed at ",
                                                        StepName(report.step), where, ": ",
                                                        std::strerror(report.value)));
    }
    // A waiting process that is gone (killed from outside) is replaced once.
    if (!was_warm || attempt > 0) {
      return absl::FailedPreconditionError(
          "sandbox: the sandbox process ended before Python started");
    }
  }
}

absl::StatusOr<SandboxResult> Sandbox::Run(const std::string& code) {
  if (code.size() > kMaxCodeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("sandbox: the code is ", code.size(), " bytes; at most ", kMaxCodeBytes));
  }
  absl::StatusOr<Process> taken = TakeReady();
  if (!taken.ok()) return taken.status();
  Process process = *taken;
  // The replacement starts while this call runs.
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (static_cast<int>(warm_.size()) >= options_.warm_processes) break;
    }
    absl::StatusOr<Process> started = Start();
    if (!started.ok()) break;  // this call still has its process; the next one reports
    std::lock_guard<std::mutex> lock(mutex_);
    warm_.push_back(*started);
  }

  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.limits.wall_time;
  SandboxResult result;
  Report ended{};
  size_t written = 0;
  bool killed = false;
  absl::Time killed_at = absl::InfiniteFuture();
  ::fcntl(process.stdin_fd, F_SETFL, O_NONBLOCK);
  if (code.empty()) ::shutdown(process.stdin_fd, SHUT_WR);
  auto kill_it = [&] {
    if (killed) return;
    // The namespace's first process: the kernel ends the rest with it.
    ::kill(process.pid, SIGKILL);
    killed_at = absl::Now();
    killed = true;
  };
  char buffer[16384];
  const size_t cap = static_cast<size_t>(options_.limits.output_bytes);
  while (process.stdout_fd >= 0 || process.stderr_fd >= 0 || process.report_fd >= 0) {
    pollfd fds[4];
    int count = 0;
    auto watch = [&](int fd, short events) {
      fds[count++] = pollfd{.fd = fd, .events = events, .revents = 0};
    };
    watch(process.stdout_fd, POLLIN);
    watch(process.stderr_fd, POLLIN);
    watch(process.report_fd, POLLIN);
    watch(written < code.size() ? process.stdin_fd : -1, POLLOUT);
    // After a kill the outputs close as the namespace's processes end; a second is allowed.
    const absl::Time until = killed ? killed_at + absl::Seconds(1) : deadline;
    const int wait_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(until - absl::Now()), 0, 1000));
    if (::poll(fds, count, wait_ms) < 0 && errno != EINTR) break;
    if (fds[3].revents != 0) {
      const ssize_t sent =
          ::send(process.stdin_fd, code.data() + written, code.size() - written, MSG_NOSIGNAL);
      if (sent > 0) written += static_cast<size_t>(sent);
      if (sent < 0 && errno != EAGAIN && errno != EINTR) written = code.size();  // it left
      if (written == code.size()) ::shutdown(process.stdin_fd, SHUT_WR);
    }
    if (fds[2].revents != 0) {
      Report report{};
      if (::read(process.report_fd, &report, sizeof(report)) ==
              static_cast<ssize_t>(sizeof(report)) &&
          report.kind == Report::kExited) {
        ended = report;
      }
      CloseFd(process.report_fd);  // Python's end is the last report
    }
    for (int which = 0; which < 2; ++which) {
      if (fds[which].revents == 0) continue;
      int& fd = which == 0 ? process.stdout_fd : process.stderr_fd;
      const ssize_t read_bytes = ::read(fd, buffer, sizeof(buffer));
      if (read_bytes <= 0) {
        if (read_bytes < 0 && errno == EINTR) continue;
        CloseFd(fd);
        continue;
      }
      std::string& text = which == 0 ? result.stdout_text : result.stderr_text;
      const size_t kept = result.stdout_text.size() + result.stderr_text.size();
      const size_t room = kept < cap ? cap - kept : 0;
      text.append(buffer, std::min(room, static_cast<size_t>(read_bytes)));
      if (static_cast<size_t>(read_bytes) > room) {
        result.output_truncated = true;
        kill_it();
      }
    }
    if (!killed && absl::Now() >= deadline) {
      result.timed_out = true;
      kill_it();
    } else if (killed && absl::Now() >= until) {
      break;  // still open a second after the kill: given up on
    }
  }
  int first_status = 0;
  if (ended.kind != Report::kExited) kill_it();
  ::waitpid(process.pid, &first_status, 0);
  process.pid = -1;
  Discard(process);
  result.wall_time = absl::Now() - start;
  result.cpu_time = absl::Milliseconds(ended.cpu_ms);
  // Python's own status when it ended by itself; else the first process's (our SIGKILL).
  const int status = ended.kind == Report::kExited ? ended.value : first_status;
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

}  // namespace rlhfd::agent

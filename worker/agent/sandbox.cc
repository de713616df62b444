#include "worker/agent/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "worker/agent/sandbox_child.h"

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

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// posix_spawn places rlhfd-sandbox's descriptors with dup2s in order, so no source may be one of
// the targets (0 to kFirstFreeFd - 1): a worker with few descriptors open gets low ones.
// Returns false (errno set) when no descriptor is left.
bool MoveAboveLauncherFds(int& fd) {
  if (fd >= kFirstFreeFd) return true;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(kFirstFreeFd));
  if (moved < 0) return false;
  ::close(fd);
  fd = moved;
  return true;
}

// The plan in a sealed memfd: each rlhfd-sandbox reads it with pread, and none can change it.
absl::StatusOr<int> PlanMemfd(const std::string& bytes) {
  int fd = ::memfd_create("rlhfd-sandbox-plan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  size_t written = 0;
  while (fd >= 0 && written < bytes.size()) {
    const ssize_t sent = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (sent <= 0) break;
    written += static_cast<size_t>(sent);
  }
  if (fd < 0 || written < bytes.size() ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0 ||
      !MoveAboveLauncherFds(fd)) {
    const int error = errno;
    CloseFd(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox: cannot hold the plan in a memfd: ", std::strerror(error)));
  }
  return fd;
}

// A root worker's sandbox runs as nobody (kSandboxId), which reaches a path only through
// directories that others may search; another worker's runs as the worker's own user.
absl::Status CheckReachable(const std::string& path, const std::string& what) {
  if (::geteuid() != 0) return absl::OkStatus();
  std::string prefix;
  for (const auto& part : std::filesystem::path(path).lexically_normal().relative_path()) {
    prefix += "/" + part.string();
    struct stat info {};
    if (::stat(prefix.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) break;
    if ((info.st_mode & S_IXOTH) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sandbox: ", what, " '", path, "' is out of reach of the sandbox's user (nobody, the ",
          "worker running as root): '", prefix, "' is not searchable by others; chmod o+x it ",
          "or choose another ", what));
    }
  }
  return absl::OkStatus();
}

// A launcher that ended after its clone without handing the first process over (killed, or
// failed at the id maps) leaves it the worker's child (CLONE_PARENT), its id unknown here: it
// ends as soon as it sees the sync pipe closed, and is reaped by its process group, the
// launcher's session (kept from reuse while a member lives). Bounded, should it not end.
void ReapOrphanedFirstProcess(pid_t launcher) {
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (absl::Now() < deadline) {
    siginfo_t info{};
    if (::waitid(P_PGID, static_cast<id_t>(launcher), &info, WEXITED | WNOHANG) != 0) {
      if (errno == EINTR) continue;
      return;  // ECHILD: none left
    }
    if (info.si_pid == 0) absl::SleepFor(absl::Milliseconds(1));  // one still running
  }
}

}  // namespace

Sandbox::Sandbox(SandboxOptions options) : options_(std::move(options)) {}

Sandbox::~Sandbox() {
  for (Process& process : warm_) Discard(process);
  for (int& fd : life_pipe_) CloseFd(fd);
  CloseFd(plan_fd_);
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
    // The sandbox's own /tmp, /work and /dev, and the host's processes, are not to be bound.
    const std::string normal = std::filesystem::path(path).lexically_normal().string();
    for (const char* own : {"/tmp", "/work", "/dev", "/proc"}) {
      if (normal == own || normal.rfind(absl::StrCat(own, "/"), 0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("sandbox read_only_paths: '", path,
                                                       "' is under ", own,
                                                       ", which the sandbox makes its own"));
      }
    }
    std::error_code error;
    if (!std::filesystem::is_directory(path, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sandbox read_only_paths: '", path, "' is not a directory"));
    }
    if (absl::Status reachable = CheckReachable(path, "read_only_paths entry"); !reachable.ok()) {
      return reachable;
    }
    read_only.push_back(std::filesystem::path(path).lexically_normal().string());
  }
  if (options.launcher.empty()) options.launcher = SandboxLauncherPath();
  if (options.launcher.empty() || ::access(options.launcher.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox: rlhfd-sandbox, the program that starts each sandboxed process, is not ",
        options.launcher.empty() ? "installed beside this executable"
                                 : absl::StrCat("executable at ", options.launcher),
        "; install it beside rlhfd-worker (cmake --install, deploy/bundle.sh)"));
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

  const char* temp = std::getenv("TMPDIR");
  const std::string temp_dir = temp != nullptr && *temp != '\0' ? temp : "/tmp";
  if (absl::Status reachable = CheckReachable(temp_dir, "TMPDIR"); !reachable.ok()) {
    return reachable;
  }
  auto plan = std::make_unique<SandboxPlan>();
  std::string root_template = absl::StrCat(temp_dir, "/rlhfd-sandbox-XXXXXX");
  if (::mkdtemp(root_template.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox: cannot make ", root_template, ": ", std::strerror(errno)));
  }
  plan->root = root_template;
  auto add = [&](SandboxPlan::Kind kind, std::string source, const std::string& inside) {
    plan->entries.push_back(SandboxPlan::Entry{.kind = kind,
                                               .source = std::move(source),
                                               .target = plan->root + inside,
                                               .inside = inside});
  };
  // The root's links into /usr (merged /usr) are links here too; real directories are bound.
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code error;
    const auto status = std::filesystem::symlink_status(top, error);
    if (error) continue;
    if (std::filesystem::is_symlink(status)) {
      add(SandboxPlan::kSymlink, std::filesystem::read_symlink(top, error).string(), top);
    } else if (std::filesystem::is_directory(status)) {
      read_only.push_back(top);
    }
  }
  for (const std::string& path : read_only) {
    std::string prefix;
    for (const auto& part : std::filesystem::path(path).relative_path()) {
      prefix += "/" + part.string();
      add(SandboxPlan::kDir, "", prefix);
    }
    add(SandboxPlan::kBindReadOnly, path, path);
  }
  add(SandboxPlan::kDir, "", "/dev");
  for (const char* device : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}) {
    add(SandboxPlan::kBindDevice, device, device);
  }
  add(SandboxPlan::kTmpfs, absl::StrCat("size=", limits.scratch_mb, "m,mode=0700"), "/work");
  add(SandboxPlan::kSymlink, "/work", "/tmp");

  plan->argv = {python, "-I", "-u", "-c", kRunner, "rlhfd-sandbox"};
  plan->env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/work", "TMPDIR=/work", "LANG=C.UTF-8"};
  auto mb = [](int64_t value) { return static_cast<rlim_t>(value) << 20; };
  plan->limits = {
      {RLIMIT_CPU, static_cast<rlim_t>(limits.cpu_seconds)},   {RLIMIT_AS, mb(limits.memory_mb)},
      {RLIMIT_NPROC, static_cast<rlim_t>(limits.processes)},   {RLIMIT_FSIZE, mb(limits.file_mb)},
      {RLIMIT_NOFILE, static_cast<rlim_t>(limits.open_files)}, {RLIMIT_CORE, 0},
  };

  std::unique_ptr<Sandbox> sandbox(new Sandbox(std::move(options)));
  const std::string encoded = EncodeSandboxPlan(*plan);
  sandbox->plan_ = std::move(plan);  // From here on the destructor removes the scratch root.
  ASSIGN_OR_RETURN(sandbox->plan_fd_, PlanMemfd(encoded));
  if (::pipe2(sandbox->life_pipe_, O_CLOEXEC) != 0 ||
      !MoveAboveLauncherFds(sandbox->life_pipe_[0])) {
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
  // Python's stdin (a socket, whose buffer takes the code), stdout, stderr and the reports: this
  // side keeps [0], rlhfd-sandbox gets [1].
  int stdin_pair[2], stdout_pipe[2], stderr_pipe[2], report_pipe[2];
  int* all[] = {stdin_pair, stdout_pipe, stderr_pipe, report_pipe};
  for (int* pair : all) pair[0] = pair[1] = -1;
  auto close_all = [&] {
    for (int* pair : all) {
      CloseFd(pair[0]);
      CloseFd(pair[1]);
    }
  };
  bool made = ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stdin_pair) == 0 &&
              ::pipe2(stdout_pipe, O_CLOEXEC) == 0 && ::pipe2(stderr_pipe, O_CLOEXEC) == 0 &&
              ::pipe2(report_pipe, O_CLOEXEC) == 0;
  for (int* pair : all) made = made && MoveAboveLauncherFds(pair[1]);
  if (!made) {
    const int error = errno;
    close_all();
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox: cannot make pipes: ", std::strerror(error)));
  }
  // 0 and 1 on /dev/null; 2 stays the worker's stderr, where the dynamic loader would say why
  // rlhfd-sandbox cannot start (the launcher puts /dev/null there before the sandbox).
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attributes);
  int prepared = ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDWR, 0);
  if (prepared == 0) prepared = ::posix_spawn_file_actions_adddup2(&actions, 0, 1);
  const std::pair<int, SandboxFd> placed[] = {
      {plan_fd_, kPlanFd},         {life_pipe_[0], kLifeFd},    {stdin_pair[1], kStdinFd},
      {stdout_pipe[1], kStdoutFd}, {stderr_pipe[1], kStderrFd}, {report_pipe[1], kReportFd},
  };
  for (const auto& [source, target] : placed) {
    if (prepared == 0) prepared = ::posix_spawn_file_actions_adddup2(&actions, source, target);
  }
  // A session of its own: the code's kill(0, ...) reaches its own sandbox's processes only, not
  // the worker's process group (the worker itself, other sandboxes). Default dispositions and no
  // blocked signal: a PID 1 takes, from inside its namespace, only the signals it handles, and
  // none of the worker's ignored or blocked ones carry over (glibc's two internal signals, 32 and
  // 33, stay ignored).
  sigset_t all_signals, none;
  ::sigfillset(&all_signals);
  ::sigemptyset(&none);
  if (prepared == 0) prepared = ::posix_spawnattr_setsigdefault(&attributes, &all_signals);
  if (prepared == 0) prepared = ::posix_spawnattr_setsigmask(&attributes, &none);
  if (prepared == 0) {
    prepared = ::posix_spawnattr_setflags(
        &attributes, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  }
  char* argv[] = {const_cast<char*>(options_.launcher.c_str()), nullptr};
  char* env[] = {nullptr};
  pid_t launcher = -1;
  const int spawned = prepared != 0 ? prepared
                                    : ::posix_spawn(&launcher, options_.launcher.c_str(), &actions,
                                                    &attributes, argv, env);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attributes);
  for (int* pair : all) CloseFd(pair[1]);
  if (spawned != 0) {
    close_all();
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox: cannot start ", options_.launcher, ": ", std::strerror(spawned)));
  }
  SandboxReport report{};
  ssize_t got = 0;
  do {
    got = ::read(report_pipe[0], &report, sizeof(report));
  } while (got < 0 && errno == EINTR);
  int launcher_status = 0;
  while (::waitpid(launcher, &launcher_status, 0) < 0 && errno == EINTR) {
  }
  if (got == static_cast<ssize_t>(sizeof(report)) && report.kind == SandboxReport::kStarted &&
      report.value > 0) {
    return Process{.pid = report.value,
                   .stdin_fd = std::exchange(stdin_pair[0], -1),
                   .stdout_fd = std::exchange(stdout_pipe[0], -1),
                   .stderr_fd = std::exchange(stderr_pipe[0], -1),
                   .report_fd = std::exchange(report_pipe[0], -1)};
  }
  close_all();
  ReapOrphanedFirstProcess(launcher);
  if (got == static_cast<ssize_t>(sizeof(report)) && report.kind == SandboxReport::kSetupFailed) {
    return SetupError(report);
  }
  const std::string how =
      WIFSIGNALED(launcher_status)
          ? absl::StrCat("killed by signal ", WTERMSIG(launcher_status))
          : absl::StrCat("exit ", WEXITSTATUS(launcher_status),
                         WEXITSTATUS(launcher_status) == 127 ? ": it could not be loaded" : "");
  return absl::FailedPreconditionError(absl::StrCat("sandbox: ", options_.launcher,
                                                    " ended without starting a sandbox (", how,
                                                    "; the worker's stderr may say why)"));
}

absl::Status Sandbox::SetupError(const SandboxReport& report) const {
  const std::string where =
      report.entry >= 0 && report.entry < static_cast<int>(plan_->entries.size())
          ? absl::StrCat(" (", plan_->entries[report.entry].inside, ")")
          : "";
  return absl::FailedPreconditionError(absl::StrCat("sandbox: setup failed at ",
                                                    SandboxStepName(report.step), where, ": ",
                                                    std::strerror(report.value)));
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
      ASSIGN_OR_RETURN(process, Start());
    }
    // The next report: Python runs, or what failed on the way.
    SandboxReport report{};
    ssize_t got = 0;
    do {
      got = ::read(process.report_fd, &report, sizeof(report));
    } while (got < 0 && errno == EINTR);
    if (got == static_cast<ssize_t>(sizeof(report)) && report.kind == SandboxReport::kReady) {
      return process;
    }
    Discard(process);
    if (got == static_cast<ssize_t>(sizeof(report)) && report.kind == SandboxReport::kSetupFailed) {
      return SetupError(report);
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
  // The replacement starts while this call runs; a slot is taken before starting, so that
  // concurrent calls do not overfill the pool.
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (static_cast<int>(warm_.size()) + starting_ >= options_.warm_processes) break;
      ++starting_;
    }
    absl::StatusOr<Process> started = Start();
    std::lock_guard<std::mutex> lock(mutex_);
    --starting_;
    if (!started.ok()) break;  // this call still has its process; the next one reports
    warm_.push_back(*started);
  }

  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.limits.wall_time;
  SandboxResult result;
  SandboxReport ended{};
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
      SandboxReport report{};
      if (::read(process.report_fd, &report, sizeof(report)) ==
              static_cast<ssize_t>(sizeof(report)) &&
          report.kind == SandboxReport::kExited) {
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
      if (result.output_truncated) continue;  // drained until the kill closes it
      std::string& text = which == 0 ? result.stdout_text : result.stderr_text;
      const size_t kept = result.stdout_text.size() + result.stderr_text.size();
      const size_t room = kept < cap ? cap - kept : 0;
      text.append(buffer, std::min(room, static_cast<size_t>(read_bytes)));
      if (static_cast<size_t>(read_bytes) > room) {
        result.output_truncated = true;
        kill_it();
        // The model reads the output as text: neither stream ends inside a character (a read
        // can end anywhere, so the stream not cut here may too).
        for (std::string* cut : {&result.stdout_text, &result.stderr_text}) {
          cut->resize(WithoutCutUtf8Tail(*cut).size());
        }
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
  if (ended.kind != SandboxReport::kExited) kill_it();
  ::waitpid(process.pid, &first_status, 0);
  process.pid = -1;
  Discard(process);
  result.wall_time = absl::Now() - start;
  result.cpu_time = absl::Milliseconds(ended.cpu_ms);
  // Python's own status when it ended by itself; else the first process's (our SIGKILL).
  const int status = ended.kind == SandboxReport::kExited ? ended.value : first_status;
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

std::string SandboxLauncherPath() {
  char path[4096];
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return "";
  std::string launcher(path, static_cast<size_t>(length));
  launcher.resize(launcher.rfind('/') + 1);
  launcher += "rlhfd-sandbox";
  return ::access(launcher.c_str(), X_OK) == 0 ? launcher : "";
}

}  // namespace rlhfd::agent

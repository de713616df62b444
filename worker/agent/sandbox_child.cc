#include "worker/agent/sandbox_child.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>

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
  kPlan = 1,
  kClone,
  kMaps,
  kWaitForMaps,
  kIds,
  kPrivateMounts,
  kRootTmpfs,
  kEntry,
  kPivot,
  kReadOnlyRoot,
  kWorkDir,
  kLimits,
  kStdio,
  kFilter,
  kExec,
  kOomScore,
};
}  // namespace

const char* SandboxStepName(int step) {
  switch (step) {
    case kPlan:
      return "reading the plan";
    case kClone:
      return "cloning into new user, mount, PID and network namespaces (are user namespaces "
             "enabled on this host?)";
    case kMaps:
      return "writing the id maps";
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
    case kFilter:
      return "installing the system-call filter";
    case kStdio:
      return "setting up stdin, stdout and stderr";
    case kExec:
      return "executing the interpreter";
    case kOomScore:
      return "raising the OOM score (/proc/self/oom_score_adj)";
    default:
      return "setup";
  }
}

namespace {

// A setup failure's report; the process ends at once.
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

// The plan's encoding: a magic with the format's version (a worker and an rlhfd-sandbox of
// different builds refuse each other), then each number in decimal ending with ':', each string
// its length (a number) then its bytes.
constexpr std::string_view kPlanMagic = "rlhfd-sandbox-plan-1:";
void PutNumber(std::string& out, uint64_t value) {
  out += std::to_string(value);
  out += ':';
}

void PutText(std::string& out, std::string_view text) {
  PutNumber(out, text.size());
  out += text;
}

class PlanReader {
 public:
  explicit PlanReader(std::string_view bytes) : rest_(bytes) {}
  bool ok() const { return ok_; }
  bool at_end() const { return rest_.empty(); }

  uint64_t Number() {
    const size_t colon = rest_.find(':');
    uint64_t value = 0;
    if (!ok_ || colon == std::string_view::npos || colon == 0) {
      ok_ = false;
      return 0;
    }
    const auto [end, error] = std::from_chars(rest_.data(), rest_.data() + colon, value);
    if (error != std::errc() || end != rest_.data() + colon) {
      ok_ = false;
      return 0;
    }
    rest_.remove_prefix(colon + 1);
    return value;
  }

  std::string Text() {
    const uint64_t size = Number();
    if (!ok_ || size > rest_.size()) {
      ok_ = false;
      return "";
    }
    std::string text(rest_.substr(0, size));
    rest_.remove_prefix(size);
    return text;
  }

  // A count of items that each take at least one byte, so a bad count cannot ask for more.
  uint64_t Count() {
    const uint64_t count = Number();
    if (count > rest_.size()) ok_ = false;
    return ok_ ? count : 0;
  }

 private:
  std::string_view rest_;
  bool ok_ = true;
};

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
#error "the sandbox's system-call filter knows x86_64 and aarch64"
#endif

// Python's system-call filter (seccomp, installed after no_new_privs, kept across execve and by
// every process the code starts). It refuses (EPERM) what the code has no use for and what
// widens the kernel's attack surface: new namespaces (unshare, setns, clone with namespace
// flags: a user namespace of its own would give the code capabilities in it), mounts, ptrace
// and other processes' memory, keys, BPF, perf events, userfaultfd, io_uring (whose requests
// bypass seccomp), modules, kexec and the like. clone3 answers ENOSYS, since its flags cannot be
// inspected: glibc then uses clone, whose flags are. Another architecture's calls (x32 on
// x86_64) end the process.
std::vector<sock_filter> SyscallFilter() {
  std::vector<sock_filter> program;
  auto statement = [&](uint16_t code, uint32_t k) { program.push_back(BPF_STMT(code, k)); };
  auto jump = [&](uint16_t code, uint32_t k, uint8_t if_true, uint8_t if_false) {
    program.push_back(BPF_JUMP(code, k, if_true, if_false));
  };
  const uint32_t refuse = SECCOMP_RET_ERRNO | EPERM;
  statement(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch));
  jump(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0);
  statement(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  statement(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr));
#if defined(__x86_64__)
  jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000 /* __X32_SYSCALL_BIT */, 0, 1);
  statement(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
#endif
  const long refused[] = {
    SYS_unshare,
    SYS_setns,
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_chroot,
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_userfaultfd,
    SYS_kexec_load,
    SYS_kexec_file_load,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_fspick,
    SYS_move_mount,
    SYS_open_tree,
    SYS_mount_setattr,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_swapon,
    SYS_swapoff,
    SYS_reboot,
    SYS_acct,
    SYS_quotactl,
    SYS_syslog,
    SYS_vhangup,
    SYS_pidfd_getfd,
#if defined(__x86_64__)
    SYS_iopl,
    SYS_ioperm,
    SYS_uselib,
#endif
  };
  for (const long number : refused) {
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(number), 0, 1);
    statement(BPF_RET | BPF_K, refuse);
  }
  jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1);
  statement(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
  // clone's flags: its first argument on both architectures (the low 32 bits, little-endian).
  jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3);
  statement(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args));
  jump(BPF_JMP | BPF_JSET | BPF_K,
       CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
           CLONE_NEWNET,
       0, 1);
  statement(BPF_RET | BPF_K, refuse);
  statement(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  return program;
}

// PID 1 of the sandbox's namespaces, cloned from the launcher: single-threaded, holding the
// SandboxFd descriptors (0-2 on /dev/null) and the read end of the sync pipe, its signals at
// their defaults. When it exits, the kernel ends whatever Python left there. Raw system calls
// (the clone was raw, so glibc's view of this process is the launcher's), and no allocation:
// `argv` and `env` were built before the clone.
[[noreturn]] void RunSandboxFirstProcess(const SandboxPlan& plan, char* const* argv,
                                         char* const* env, const sock_fprog& filter, int sync_fd) {
  const int report_fd = kReportFd;
  char byte = 0;
  if (::read(sync_fd, &byte, 1) != 1) Fail(report_fd, kWaitForMaps);
  // The clone kept the worker's ids, which a root worker's map leaves unmapped here (files made
  // by an unmapped id fail with EOVERFLOW): take the mapped one, keeping the namespace's
  // capabilities for the setup (execve drops them, the id not being 0).
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

  // SIGCHLD through a descriptor: orphans of the code's become this process's children, and are
  // waited for as they end (else they stay zombies, counted by RLIMIT_NPROC, until the call
  // ends). Python's child unblocks it before its exec.
  sigset_t child_ended;
  ::sigemptyset(&child_ended);
  ::sigaddset(&child_ended, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &child_ended, nullptr);
  const int child_fd = ::signalfd(-1, &child_ended, SFD_CLOEXEC | SFD_NONBLOCK);
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) Fail(report_fd, kExec);
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
    if (::dup2(kStdinFd, 0) < 0 || ::dup2(kStdoutFd, 1) < 0 || ::dup2(kStderrFd, 2) < 0) {
      Fail(exec_pipe[1], kStdio);
    }
    // Everything else closes at exec, the exec pipe too (its EOF: Python runs). Where
    // close_range is refused (Linux < 5.11, a seccomp profile), one by one: this process holds
    // only the launcher's few descriptors.
    if (::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) != 0) {
      for (int fd = 3; fd < 64; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) != 0) {
      Fail(exec_pipe[1], kFilter);
    }
    ::execve(argv[0], argv, env);
    Fail(exec_pipe[1], kExec);
  }
  // Only Python holds its stdin, stdout and stderr: their EOFs are its.
  ::close(kStdinFd);
  ::close(kStdoutFd);
  ::close(kStderrFd);
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
  while (true) {
    pollfd fds[2] = {{.fd = kLifeFd, .events = POLLIN, .revents = 0},
                     {.fd = child_fd, .events = POLLIN, .revents = 0}};
    ::poll(fds, 2, child_fd < 0 ? 20 : -1);
    if (fds[0].revents != 0) ::_exit(0);  // the worker is gone
    signalfd_siginfo ended{};
    while (child_fd >= 0 && ::read(child_fd, &ended, sizeof(ended)) > 0) {
    }
    int status = 0;
    rusage usage{};
    for (pid_t child; (child = ::wait4(-1, &status, WNOHANG, &usage)) > 0;) {
      if (child != python) continue;  // an orphan, gone
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

bool WriteProcFile(pid_t pid, const char* name, const std::string& text) {
  const std::string path = "/proc/" + std::to_string(pid) + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int error = errno;
  ::close(fd);
  errno = error;
  return written;
}

}  // namespace

std::string EncodeSandboxPlan(const SandboxPlan& plan) {
  std::string out(kPlanMagic);
  PutText(out, plan.root);
  PutNumber(out, plan.entries.size());
  for (const SandboxPlan::Entry& entry : plan.entries) {
    PutNumber(out, entry.kind);
    PutText(out, entry.source);
    PutText(out, entry.target);
    PutText(out, entry.inside);
  }
  for (const std::vector<std::string>* list : {&plan.argv, &plan.env}) {
    PutNumber(out, list->size());
    for (const std::string& text : *list) PutText(out, text);
  }
  PutNumber(out, plan.limits.size());
  for (const auto& [resource, value] : plan.limits) {
    PutNumber(out, static_cast<uint64_t>(resource));
    PutNumber(out, value);
  }
  return out;
}

std::optional<SandboxPlan> DecodeSandboxPlan(std::string_view bytes) {
  if (!bytes.starts_with(kPlanMagic)) return std::nullopt;
  PlanReader reader(bytes.substr(kPlanMagic.size()));
  SandboxPlan plan;
  plan.root = reader.Text();
  for (uint64_t i = 0, count = reader.Count(); i < count && reader.ok(); ++i) {
    const uint64_t kind = reader.Number();
    if (kind > SandboxPlan::kTmpfs) return std::nullopt;
    SandboxPlan::Entry entry{.kind = static_cast<SandboxPlan::Kind>(kind)};
    entry.source = reader.Text();
    entry.target = reader.Text();
    entry.inside = reader.Text();
    plan.entries.push_back(std::move(entry));
  }
  for (std::vector<std::string>* list : {&plan.argv, &plan.env}) {
    for (uint64_t i = 0, count = reader.Count(); i < count && reader.ok(); ++i) {
      list->push_back(reader.Text());
    }
  }
  for (uint64_t i = 0, count = reader.Count(); i < count && reader.ok(); ++i) {
    const uint64_t resource = reader.Number();
    const uint64_t value = reader.Number();
    if (resource >= RLIM_NLIMITS) return std::nullopt;
    plan.limits.emplace_back(static_cast<int>(resource), static_cast<rlim_t>(value));
  }
  if (!reader.ok() || !reader.at_end() || plan.root.empty() || plan.argv.empty()) {
    return std::nullopt;
  }
  return plan;
}

int RunSandboxLauncher() {
  // Whatever the worker held without close-on-exec is not the sandbox's. Where close_range is
  // refused, one by one up to the descriptor limit.
  if (::syscall(SYS_close_range, static_cast<unsigned int>(kFirstFreeFd), ~0U, 0U) != 0) {
    rlimit open_files{};
    ::getrlimit(RLIMIT_NOFILE, &open_files);
    const rlim_t last = std::min<rlim_t>(open_files.rlim_max, rlim_t{1} << 20);
    for (rlim_t fd = kFirstFreeFd; fd < last; ++fd) ::close(static_cast<int>(fd));
  }
  if (::fcntl(2, F_GETFD) < 0) ::dup2(0, 2);  // the worker ran without stderr
  std::string bytes;
  struct stat info {};
  if (::fstat(kPlanFd, &info) == 0 && info.st_size > 0) {
    bytes.resize(static_cast<size_t>(info.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t read_bytes =
          ::pread(kPlanFd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
      if (read_bytes <= 0) break;
      got += static_cast<size_t>(read_bytes);
    }
    bytes.resize(got);
  }
  ::close(kPlanFd);
  const std::optional<SandboxPlan> plan = DecodeSandboxPlan(bytes);
  if (!plan.has_value()) {
    errno = EINVAL;
    Fail(kReportFd, kPlan);
  }
  std::vector<char*> argv, env;
  for (const std::string& text : plan->argv) argv.push_back(const_cast<char*>(text.c_str()));
  argv.push_back(nullptr);
  for (const std::string& text : plan->env) env.push_back(const_cast<char*>(text.c_str()));
  env.push_back(nullptr);
  // The kernel's OOM killer takes the sandbox's processes first, the worker last: RLIMIT_AS
  // bounds each process, not their sum, so a host or cgroup short of memory loses the call,
  // not the worker holding the job. Every process after inherits it; raising one's own score
  // needs no privilege, and the code cannot lower it again: the sandbox has no /proc (and a root
  // launcher's write also makes 1000 the process's floor).
  const int oom_score = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom_score < 0 || ::write(oom_score, "1000", 4) != 4) Fail(kReportFd, kOomScore);
  ::close(oom_score);
  std::vector<sock_filter> filter_program = SyscallFilter();
  const sock_fprog filter{.len = static_cast<unsigned short>(filter_program.size()),
                          .filter = filter_program.data()};
  int sync_pipe[2];
  if (::pipe2(sync_pipe, O_CLOEXEC) != 0) Fail(kReportFd, kClone);
  // stderr was the worker's, for the dynamic loader's messages; the sandbox gets none of it.
  ::dup2(0, 2);
  // The worker's child, not this process's: the worker waits for it and kills it, and this
  // process exits as soon as the first process has its id maps.
  const long pid = ::syscall(SYS_clone,
                             CLONE_PARENT | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID |
                                 CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD,
                             nullptr, nullptr, nullptr, nullptr);
  if (pid == 0) {
    ::close(sync_pipe[1]);
    RunSandboxFirstProcess(*plan, argv.data(), env.data(), filter, sync_pipe[0]);
  }
  if (pid < 0) Fail(kReportFd, kClone);
  const SandboxReport started{.kind = SandboxReport::kStarted, .value = static_cast<int>(pid)};
  // (A worker gone by now ends this process with SIGPIPE; the first process then sees the
  // sync pipe close and ends too.)
  if (::write(kReportFd, &started, sizeof(started)) != static_cast<ssize_t>(sizeof(started))) {
    return 1;
  }
  // A root worker maps the sandbox's id onto nobody, so that its processes are an unprivileged
  // user's (RLIMIT_NPROC holds); another maps it onto its own ids.
  const bool root = ::geteuid() == 0;
  const std::string uid_map =
      std::to_string(kSandboxId) + " " + std::to_string(root ? kSandboxId : ::geteuid()) + " 1\n";
  const std::string gid_map =
      std::to_string(kSandboxId) + " " + std::to_string(root ? kSandboxId : ::getegid()) + " 1\n";
  const pid_t first = static_cast<pid_t>(pid);
  if (!(root || WriteProcFile(first, "setgroups", "deny")) ||
      !WriteProcFile(first, "uid_map", uid_map) || !WriteProcFile(first, "gid_map", gid_map)) {
    Fail(kReportFd, kMaps);
  }
  if (::write(sync_pipe[1], "g", 1) != 1) Fail(kReportFd, kWaitForMaps);
  return 0;
}

}  // namespace rlhfd::agent

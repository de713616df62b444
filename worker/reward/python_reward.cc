#include "worker/reward/python_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"

extern char** environ;

namespace rlhfd::reward {
namespace {

using Clock = std::chrono::steady_clock;

// A reply larger than this is not one of the runner's (a traceback is cut well below it).
constexpr size_t kMaxFrameBytes = 16 << 20;

std::string Frame(const nlohmann::json& message) {
  const std::string body = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return absl::StrCat(body.size(), "\n", body);
}

bool IsExecutable(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// The interpreter: `configured`, else $RLHFD_PYTHON, else python3 on PATH (found here, before
// fork, since the child may only make async-signal-safe calls).
absl::StatusOr<std::string> ResolvePython(const std::string& configured) {
  std::string wanted = configured;
  if (wanted.empty()) {
    const char* env = std::getenv("RLHFD_PYTHON");
    wanted = env != nullptr && *env != '\0' ? env : "python3";
  }
  if (wanted.find('/') != std::string::npos) {
    if (IsExecutable(wanted)) return wanted;
    return absl::FailedPreconditionError(
        absl::StrCat("roles.reward.custom_reward_function: the Python interpreter ", wanted,
                     " ($RLHFD_PYTHON) is not an executable file on this worker"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", wanted);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "roles.reward.custom_reward_function: no ", wanted,
      " on this worker's PATH; install Python 3 or point $RLHFD_PYTHON at an interpreter"));
}

std::string Describe(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int signal = WTERMSIG(wait_status);
    return absl::StrCat("was killed by signal ", signal, " (", strsignal(signal), ")");
  }
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  return "stopped";
}

// The job's message is cut at 2,000 bytes: the end of a long traceback (the innermost frames
// and the exception) is kept, and the worker's log has the whole of it.
constexpr size_t kMaxTracebackBytes = 1200;

// What a runner's {"error", "traceback"} says, for the job's message.
std::string FailureText(const nlohmann::json& reply) {
  const auto text = [&](const char* key) {
    const auto found = reply.find(key);
    if (found == reply.end()) return std::string();
    return found->is_string() ? found->get<std::string>() : found->dump();
  };
  const std::string error = text("error");
  std::string traceback = text("traceback");
  if (traceback.empty()) return error;
  if (traceback.size() > kMaxTracebackBytes) {
    size_t cut = traceback.size() - kMaxTracebackBytes;
    while (cut < traceback.size() && (static_cast<unsigned char>(traceback[cut]) & 0xC0) == 0x80) {
      ++cut;
    }
    traceback = absl::StrCat("...", traceback.substr(cut));
  }
  return absl::StrCat(error, "; traceback:\n", traceback);
}

}  // namespace

struct PythonReward::Process {
  pid_t pid = -1;        // -1 once reaped
  pid_t group = -1;      // its process group (the runner's first pid), outlives the runner
  int fd = -1;           // this side of the socket pair
  std::string received;  // bytes read and not yet a whole frame
  int64_t call = -1;     // the call it is running, -1 when idle
  Clock::time_point deadline;
};

PythonReward::PythonReward(PythonRewardOptions options) : options_(std::move(options)) {}

PythonReward::~PythonReward() {
  for (auto& process : processes_) Kill(*process);
}

std::vector<pid_t> PythonReward::pids() const {
  std::vector<pid_t> pids;
  for (const auto& process : processes_) {
    if (process->pid > 0) pids.push_back(process->pid);
  }
  return pids;
}

void PythonReward::Kill(Process& process) {
  // The runner leads its own process group: whatever the function started goes with it.
  if (process.group > 0) ::kill(-process.group, SIGKILL);
  if (process.pid > 0) {
    ::kill(process.pid, SIGKILL);
    int status = 0;
    while (::waitpid(process.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (process.fd >= 0) ::close(process.fd);
  process = Process();
}

namespace {

// Reads what `fd` has into `buffer`; false at end of file or on an error.
bool ReadAvailable(int fd, std::string& buffer) {
  char chunk[65536];
  for (;;) {
    const ssize_t got = ::recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got > 0) {
      buffer.append(chunk, static_cast<size_t>(got));
      if (buffer.size() > kMaxFrameBytes + 32) return false;
      continue;
    }
    if (got == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

// The first whole frame of `buffer`, removed from it; discarded JSON when the frame is
// malformed; null when no whole frame is there yet.
std::optional<nlohmann::json> TakeFrame(std::string& buffer) {
  const size_t newline = buffer.find('\n');
  if (newline == std::string::npos) {
    if (buffer.size() > 20) return nlohmann::json(nlohmann::json::value_t::discarded);
    return std::nullopt;
  }
  size_t length = 0;
  if (!absl::SimpleAtoi(absl::string_view(buffer).substr(0, newline), &length) ||
      length > kMaxFrameBytes) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
  if (buffer.size() < newline + 1 + length) return std::nullopt;
  nlohmann::json message = nlohmann::json::parse(buffer.begin() + newline + 1,
                                                 buffer.begin() + newline + 1 + length, nullptr,
                                                 /*allow_exceptions=*/false);
  buffer.erase(0, newline + 1 + length);
  return message;
}

// An idle runner has nothing to say: a readable or hung-up socket means it died (or broke the
// protocol) since its last call.
bool IdleAndAlive(int fd) {
  pollfd watched = {fd, POLLIN, 0};
  return ::poll(&watched, 1, 0) == 0;
}

// The exit status of a runner whose socket closed, waiting at most a second for it to end (one
// that closed its socket but lives on is killed by the caller); 0 when it has not ended.
pid_t ReapBriefly(pid_t pid, int* status) {
  for (int i = 0; i < 100; ++i) {
    const pid_t dead = ::waitpid(pid, status, WNOHANG);
    if (dead != 0) return dead;
    ::usleep(10'000);
  }
  return 0;
}

bool SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t wrote = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    sent += static_cast<size_t>(wrote);
  }
  return true;
}

}  // namespace

absl::Status PythonReward::Start(Process& process) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  const int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Everything the child needs is made before fork: after it only async-signal-safe calls.
  const std::vector<std::string> args = {python_, "-u", options_.runner};
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const rlim_t limit = options_.memory_limit_mb > 0
                           ? static_cast<rlim_t>(options_.memory_limit_mb) << 20
                           : RLIM_INFINITY;
  const long open_limit = ::sysconf(_SC_OPEN_MAX);
  const int open_max =
      open_limit > 0 ? static_cast<int>(std::min<long>(open_limit, 1 << 20)) : 1024;
  // A send to a runner that stopped reading fails after the call's deadline instead of blocking
  // the worker's stage executor.
  const int64_t send_ms = std::max<int64_t>(1000, absl::ToInt64Milliseconds(options_.timeout));
  const timeval send_timeout = {.tv_sec = static_cast<time_t>(send_ms / 1000),
                                .tv_usec = static_cast<suseconds_t>(send_ms % 1000 * 1000)};
  ::setsockopt(pair[0], SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(pair[0]);
    ::close(pair[1]);
    if (dev_null >= 0) ::close(dev_null);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(error)));
  }
  if (pid == 0) {
    // No PR_SET_PDEATHSIG: it fires when the forking thread ends, which a stage thread may do
    // while the worker lives on; the runner watches for its worker's end itself.
    // The runner talks on fd 3; fd 1 goes to the worker's log (fd 2), so that a print in the
    // user's function cannot corrupt the protocol. Both descriptors move above 10 first, so that
    // neither is overwritten by the other's dup2 whatever numbers they had.
    const int channel = ::fcntl(pair[1], F_DUPFD, 10);
    const int input = dev_null >= 0 ? ::fcntl(dev_null, F_DUPFD, 10) : -1;
    if (channel < 0 || ::dup2(channel, 3) < 0) ::_exit(127);
    if (input >= 0) ::dup2(input, 0);
    ::dup2(2, 1);
    // Its own process group: a deadline kill reaches what the function started, and a Ctrl-C
    // at the worker's terminal does not reach the function.
    ::setpgid(0, 0);
    if (::syscall(SYS_close_range, 4u, ~0u, 0u) != 0) {
      // Kernels before 5.9 (or a seccomp profile without it): one close per descriptor.
      for (int fd = 4; fd < open_max; ++fd) ::close(fd);
    }
    struct rlimit address_space = {limit, limit};
    ::setrlimit(RLIMIT_AS, &address_space);
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
  ::close(pair[1]);
  if (dev_null >= 0) ::close(dev_null);
  ::setpgid(pid, pid);  // As the child does: whichever runs first, the group exists after.
  process.pid = pid;
  process.group = pid;
  process.fd = pair[0];
  process.call = -1;
  process.received.clear();
  ++started_;
  const auto fail = [&](const std::string& message) {
    Kill(process);
    return absl::InvalidArgumentError(
        absl::StrCat("roles.reward.custom_reward_function: ", message));
  };
  if (!SendAll(process.fd, setup_)) {
    return fail(absl::StrCat("the Python process (", python_, " ", options_.runner,
                             ") exited before it read its setup"));
  }
  // The import gets the per-call deadline, and at least 60 s (a large module on a busy host).
  const Clock::time_point deadline =
      Clock::now() +
      std::max(std::chrono::milliseconds(60'000),
               std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.timeout)));
  bool closed = false;
  for (;;) {
    if (std::optional<nlohmann::json> message = TakeFrame(process.received)) {
      // Only the runner's own {"ready": true}: user code may write to the socket too.
      if (message->is_object() && message->value("ready", nlohmann::json()) == true) {
        return absl::OkStatus();
      }
      if (message->is_object() && message->contains("error")) {
        RLOG(WARNING) << "loading " << options_.name << " from " << options_.path
                      << " failed: " << message->dump();
        return fail(absl::StrCat("loading ", options_.name, " from ", options_.path,
                                 " failed: ", FailureText(*message)));
      }
      return fail(
          "the Python process answered its setup with something else than the runner's "
          "reply");
    }
    if (closed) {
      int status = 0;
      const pid_t dead = ReapBriefly(process.pid, &status);
      if (dead == process.pid) process.pid = -1;
      return fail(absl::StrCat("the Python process (", python_, " ", options_.runner, ") ",
                               dead > 0 ? Describe(status) : "closed its socket", " while loading ",
                               options_.path, "; its output is in the worker's log"));
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return fail(absl::StrCat("importing ", options_.path, " took longer than ",
                               std::max<int64_t>(60, absl::ToInt64Seconds(options_.timeout)),
                               " s"));
    }
    pollfd watched = {process.fd, POLLIN, 0};
    const int ready = ::poll(&watched, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return fail(absl::StrCat("poll: ", std::strerror(errno)));
    if (ready > 0 && !ReadAvailable(process.fd, process.received)) closed = true;
  }
}

absl::StatusOr<std::unique_ptr<PythonReward>> PythonReward::Create(PythonRewardOptions options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("roles.reward.custom_reward_function.path is required");
  }
  if (options.processes < 1 || options.processes > config::kMaxPythonRewardProcesses) {
    return absl::InvalidArgumentError(
        absl::StrCat("roles.reward.custom_reward_function.processes must be 1..",
                     config::kMaxPythonRewardProcesses));
  }
  if (options.runner.empty()) options.runner = RewardRunnerPath();
  if (options.runner.empty() || ::access(options.runner.c_str(), R_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "roles.reward.custom_reward_function: reward_runner.py is not installed beside this "
        "worker (looked for ",
        options.runner.empty() ? "<bin>/reward_runner.py and <bin>/../share/rlhfd/"
                               : options.runner,
        "); reinstall rlhfd"));
  }
  auto reward = std::unique_ptr<PythonReward>(new PythonReward(std::move(options)));
  ASSIGN_OR_RETURN(reward->python_, ResolvePython(reward->options_.python));
  reward->setup_ = Frame({{"worker_pid", ::getpid()},
                          {"path", reward->options_.path},
                          {"name", reward->options_.name},
                          {"reward_kwargs", reward->options_.reward_kwargs}});
  for (int i = 0; i < reward->options_.processes; ++i) {
    reward->processes_.push_back(std::make_unique<Process>());
  }
  RETURN_IF_ERROR(reward->Start(*reward->processes_[0]));
  return reward;
}

absl::StatusOr<std::vector<double>> PythonReward::Score(const std::vector<PythonRewardCall>& calls,
                                                        int64_t first_row,
                                                        const std::atomic<bool>* cancelled) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<double> scores(calls.size(), 0.0);
  std::deque<int64_t> pending;
  for (int64_t i = 0; i < static_cast<int64_t>(calls.size()); ++i) pending.push_back(i);
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.timeout));
  const std::string function = absl::StrCat(options_.name, " (", options_.path, ")");
  int64_t answered = 0;
  // Ends the batch: processes still running a call are killed, so the next batch finds the
  // pool clean (their replies would otherwise be read as the next batch's).
  const auto finish = [&](absl::Status status) -> absl::StatusOr<std::vector<double>> {
    for (auto& process : processes_) {
      if (process->call >= 0) Kill(*process);
    }
    if (!status.ok()) return status;
    return scores;
  };
  while (answered < static_cast<int64_t>(calls.size())) {
    if (cancelled != nullptr && cancelled->load()) {
      return finish(absl::CancelledError("scoring with the Python reward was cancelled"));
    }
    // Hand each idle process the next call, starting processes that are not running.
    for (auto& slot : processes_) {
      Process& process = *slot;
      if (pending.empty()) break;
      if (process.call >= 0) continue;
      if (process.pid > 0 && !IdleAndAlive(process.fd)) Kill(process);
      if (process.pid <= 0) {
        if (absl::Status started = Start(process); !started.ok()) return finish(started);
      }
      const int64_t index = pending.front();
      const PythonRewardCall& call = calls[static_cast<size_t>(index)];
      const std::string request = Frame({{"id", index},
                                         {"data_source", call.data_source},
                                         {"solution_str", call.solution_str},
                                         {"ground_truth", call.ground_truth},
                                         {"extra_info", call.extra_info}});
      if (!SendAll(process.fd, request)) {
        // It died while idle (a previous call's leftovers, or killed from outside): replace it
        // and try again.
        Kill(process);
        if (absl::Status started = Start(process); !started.ok()) return finish(started);
        if (!SendAll(process.fd, request)) {
          Kill(process);
          return finish(absl::InternalError(
              absl::StrCat("the Python reward process for ", function, " closed its socket")));
        }
      }
      pending.pop_front();
      process.call = index;
      process.deadline = Clock::now() + timeout;
    }
    std::vector<pollfd> watched;
    std::vector<Process*> busy;
    Clock::time_point next_deadline = Clock::now() + std::chrono::milliseconds(200);
    for (auto& slot : processes_) {
      if (slot->call < 0) continue;
      watched.push_back({slot->fd, POLLIN, 0});
      busy.push_back(slot.get());
      next_deadline = std::min(next_deadline, slot->deadline);
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now());
    const int ready = ::poll(watched.data(), watched.size(),
                             static_cast<int>(std::max<int64_t>(0, wait.count()) + 1));
    if (ready < 0 && errno != EINTR) {
      return finish(absl::InternalError(absl::StrCat("poll: ", std::strerror(errno))));
    }
    for (size_t k = 0; k < busy.size(); ++k) {
      Process& process = *busy[k];
      const int64_t index = process.call;
      const std::string row = absl::StrCat("row ", first_row + index);
      if (watched[k].revents != 0) {
        const bool open = ReadAvailable(process.fd, process.received);
        std::optional<nlohmann::json> reply = TakeFrame(process.received);
        if (!reply.has_value()) {
          if (open) continue;
          int status = 0;
          const pid_t dead = ReapBriefly(process.pid, &status);
          if (dead == process.pid) process.pid = -1;
          Kill(process);
          return finish(absl::InvalidArgumentError(absl::StrCat(
              row, ": the Python process running ", function, " ",
              dead > 0 ? Describe(status) : "closed its socket",
              " while scoring it: the function ended it (os._exit, a signal, a crash "
              "in native code) or it reached its memory limit of ",
              options_.memory_limit_mb, " MiB; a new process takes its place for the next step")));
        }
        if (!reply->is_object() || !reply->contains("id") || (*reply)["id"] != index) {
          Kill(process);
          return finish(absl::InternalError(
              absl::StrCat(row, ": the Python reward process sent a malformed reply")));
        }
        process.call = -1;
        if (reply->contains("error")) {
          if (reply->contains("traceback")) {
            RLOG(WARNING) << row << ": " << function << " raised: " << reply->dump();
            return finish(absl::InvalidArgumentError(
                absl::StrCat(row, ": ", function, " raised ", FailureText(*reply))));
          }
          return finish(absl::InvalidArgumentError(
              absl::StrCat(row, ": ", FailureText(*reply), " (", options_.path, ")")));
        }
        const auto score = reply->find("score");
        if (score == reply->end() || !score->is_number()) {
          return finish(absl::InvalidArgumentError(
              absl::StrCat(row, ": ", function, " gave no numeric score")));
        }
        scores[static_cast<size_t>(index)] = score->get<double>();
        ++answered;
      } else if (Clock::now() >= process.deadline) {
        Kill(process);
        // Not DEADLINE_EXCEEDED: that is a fault the controller retries, and the function
        // would only hang again.
        return finish(absl::InvalidArgumentError(absl::StrCat(
            row, ": ", function, " did not return within ", absl::FormatDuration(options_.timeout),
            " (roles.reward.custom_reward_function.timeout_s); its process was killed and is "
            "restarted for the next step")));
      }
    }
  }
  return finish(absl::OkStatus());
}

std::string RewardRunnerPath() {
  char path[4096];
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return "";
  path[length] = '\0';
  std::string directory(path);
  directory.resize(directory.rfind('/'));
  for (const std::string& candidate :
       {absl::StrCat(directory, "/reward_runner.py"),
        absl::StrCat(directory, "/../share/rlhfd/reward_runner.py")}) {
    if (::access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace rlhfd::reward

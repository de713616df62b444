// fork/exec process handling for tests.
#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"

namespace rlhfd::testing {
namespace {

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path, const std::string& cwd = "") {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(125);
  // Child: a new process group so a stray grandchild dies with it.
  ::setpgid(0, 0);
  // Unblock signals the test harness may have blocked.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int err =
      err_path == out_path ? out : ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out < 0 || err < 0) ::_exit(126);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  ::_exit(127);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

Subprocess::Subprocess(std::vector<std::string> argv, std::string log_path)
    : log_path_(std::move(log_path)) {
  pid_ = Spawn(argv, log_path_, log_path_);
}

Subprocess::~Subprocess() {
  if (running()) Stop(SIGKILL, absl::Seconds(5));
}

bool Subprocess::running() {
  if (exit_status_.has_value() || pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_status_ = DecodeStatus(status);
    return false;
  }
  return true;
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  WaitFor([this] { return !running(); }, timeout);
  return exit_status_;
}

std::optional<int> Subprocess::Stop(int signal, absl::Duration timeout) {
  if (running()) ::kill(pid_, signal);
  return Wait(timeout);
}

std::string Subprocess::ReadLog() const { return Slurp(log_path_); }

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                         const std::string& cwd) {
  TempDir dir;
  const std::string out_path = dir.path() + "/out", err_path = dir.path() + "/err";
  const pid_t pid = Spawn(argv, out_path, err_path, cwd);
  CommandResult result;
  int status = 0;
  const bool exited = WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, timeout);
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    result.err = "command timed out\n";
  }
  result.exit_code = exited ? DecodeStatus(status) : -1;
  result.out = Slurp(out_path);
  result.err += Slurp(err_path);
  return result;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(base && *base ? base : "/tmp", "/rlhfd-test-XXXXXX");
  path_ = ::mkdtemp(pattern.data()) ? pattern : "";
}

TempDir::~TempDir() {
  if (!path_.empty()) (void)RemoveTree(path_);
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace rlhfd::testing

// The control-plane benchmarks' helper processes: copies of the benchmark's own binary (its
// simulated workers) or another program (a controller), each with a pipe on its stdin that this
// process holds, so a child can live until the pipe closes; all are ended (stdin closed, SIGTERM)
// and reaped on destruction.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlhfd::bench {

class ChildProcesses {
 public:
  ChildProcesses() = default;
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;
  ~ChildProcesses() {
    CloseStdins();
    for (pid_t pid : pids_) ::kill(pid, SIGTERM);
    WaitAll();
  }

  // Starts `program` ("/proc/self/exe": this binary) with `args` after argv[0]; its stdout and
  // stderr are appended to `log` when given. Returns its pid.
  absl::StatusOr<pid_t> Start(const std::string& program, const std::vector<std::string>& args,
                              const std::string& log = "") {
    int pipe_fds[2];
    // Close-on-exec: a later child must not hold an earlier one's stdin open.
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[0], 0);
    if (!log.empty()) {
      posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
    }
    std::vector<std::string> all = {program};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : all) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int spawned =
        ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[0]);
    if (spawned != 0) {
      ::close(pipe_fds[1]);
      return absl::InternalError("cannot start " + program);
    }
    pids_.push_back(pid);
    stdin_fds_.push_back(pipe_fds[1]);
    return pid;
  }

  // Closes every child's stdin (a child that waits on it then ends) and reaps them all.
  void CloseStdinsAndWait() {
    CloseStdins();
    WaitAll();
  }

 private:
  void CloseStdins() {
    for (int fd : stdin_fds_) ::close(fd);
    stdin_fds_.clear();
  }
  void WaitAll() {
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
    pids_.clear();
  }

  std::vector<pid_t> pids_;
  std::vector<int> stdin_fds_;
};

// A child's side: returns once its stdin (the parent's pipe) closes.
inline void WaitForStdinToClose() {
  char byte;
  while (::read(0, &byte, 1) > 0) {
  }
}

}  // namespace rlhfd::bench

// LocalCluster: a real rlhfd-controller and real rlhfd-workers on loopback (ephemeral ports) for
// integration tests, plus a way to run rlhfctl against them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/support/subprocess.h"

namespace rlhfd::testing {

struct LocalClusterBinaries {
  std::string controller;
  std::string worker;
  std::string ctl;
};

class LocalCluster {
 public:
  LocalCluster(LocalClusterBinaries binaries, absl::Duration heartbeat_interval,
               absl::Duration liveness_window);
  ~LocalCluster();

  // Flags added to the controller (`server`) and to workers and rlhfctl (`client`), e.g. TLS.
  void SetExtraFlags(std::vector<std::string> server, std::vector<std::string> client) {
    server_flags_ = std::move(server);
    client_flags_ = std::move(client);
  }

  // Starts the controller (on a free port the first time, on the same port after a restart)
  // and waits for it to serve. False (with its log in `error`) if it does not come up.
  bool StartController(std::string* error);
  // SIGTERM (or `signal`), then waits for exit; returns the exit status.
  std::optional<int> StopController(int signal);

  // Starts a CPU worker (id cpu-worker-<index> unless given, with `flags` besides the
  // cluster's); returns its index.
  size_t StartWorker(const std::string& worker_id = "", const std::vector<std::string>& flags = {});
  // Starts worker `index` again (after it exited or was killed), with the same id.
  void RestartWorker(size_t index);
  // The port worker `index` serves on, once it is up (0 if it is not within 20 s).
  int WorkerPort(size_t index);
  Subprocess& worker(size_t index) { return *workers_.at(index); }

  // Runs rlhfctl with this cluster's address and token plus `args`.
  CommandResult Ctl(const std::vector<std::string>& args) const;
  // As Ctl, with a different token.
  CommandResult CtlWithToken(const std::string& token, const std::vector<std::string>& args) const;

  const std::string& state_dir() const { return state_dir_; }
  std::string address() const;
  Subprocess* controller() { return controller_.get(); }

 private:
  LocalClusterBinaries binaries_;
  absl::Duration heartbeat_interval_;
  absl::Duration liveness_window_;
  TempDir dir_;
  std::string state_dir_;
  std::vector<std::string> server_flags_;
  std::vector<std::string> client_flags_;
  int port_ = 0;
  int controller_starts_ = 0;
  std::unique_ptr<Subprocess> controller_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::vector<std::vector<std::string>> worker_argv_;
  std::vector<int> worker_starts_;
};

}  // namespace rlhfd::testing

// LocalCluster process management.
#include "absl/strings/string_view.h"
#include "tests/support/cluster_fixture.h"

#include <signal.h>

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/util/files.h"

namespace rlhfd::testing {
namespace {

std::string Flag(absl::string_view name, absl::Duration value) {
  return absl::StrCat("--", name, "=", absl::FormatDuration(value));
}

int ReadPort(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  int port = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) ? port : 0;
}

}  // namespace

LocalCluster::LocalCluster(LocalClusterBinaries binaries, absl::Duration heartbeat_interval,
                           absl::Duration liveness_window)
    : binaries_(std::move(binaries)),
      heartbeat_interval_(heartbeat_interval),
      liveness_window_(liveness_window),
      state_dir_(dir_.path() + "/state") {}

LocalCluster::~LocalCluster() {
  for (auto& worker : workers_) {
    if (worker) worker->Stop(SIGKILL, absl::Seconds(5));
  }
  if (controller_) controller_->Stop(SIGKILL, absl::Seconds(5));
}

std::string LocalCluster::address() const { return absl::StrCat("127.0.0.1:", port_); }

bool LocalCluster::StartController(std::string* error) {
  const std::string port_file = dir_.path() + "/controller.port";
  (void)RemoveTree(port_file);
  const std::string log = absl::StrCat(dir_.path(), "/controller.", ++controller_starts_, ".log");
  std::vector<std::string> argv = {binaries_.controller, absl::StrCat("--listen=", address()),
                                   "--state_dir=" + state_dir_, "--port_file=" + port_file,
                                   Flag("heartbeat_interval", heartbeat_interval_),
                                   Flag("liveness_window", liveness_window_),
                                   "--shutdown_deadline=2s"};
  argv.insert(argv.end(), server_flags_.begin(), server_flags_.end());
  controller_ = std::make_unique<Subprocess>(argv, log);
  const bool up = WaitFor([&] { return ReadPort(port_file) > 0 || !controller_->running(); },
                          absl::Seconds(20));
  if (!up || !controller_->running()) {
    *error = absl::StrCat("controller did not start; its log:\n", controller_->ReadLog());
    return false;
  }
  port_ = ReadPort(port_file);
  return true;
}

std::optional<int> LocalCluster::StopController(int signal) {
  return controller_->Stop(signal, absl::Seconds(15));
}

size_t LocalCluster::StartWorker(const std::string& worker_id,
                                 const std::vector<std::string>& flags) {
  const size_t index = workers_.size();
  std::vector<std::string> argv = {binaries_.worker, "--controller=" + address(), "--device=cpu",
                                   "--token_file=" + state_dir_ + "/token",
                                   "--worker_id=" + (worker_id.empty()
                                                         ? absl::StrCat("cpu-worker-", index)
                                                         : worker_id),
                                   "--rpc_timeout=2s",
                                   absl::StrCat("--port_file=", dir_.path(), "/worker", index,
                                                ".port")};
  argv.insert(argv.end(), client_flags_.begin(), client_flags_.end());
  argv.insert(argv.end(), flags.begin(), flags.end());
  worker_argv_.push_back(argv);
  worker_starts_.push_back(0);
  workers_.push_back(nullptr);
  RestartWorker(index);
  return index;
}

void LocalCluster::RestartWorker(size_t index) {
  (void)RemoveTree(absl::StrCat(dir_.path(), "/worker", index, ".port"));
  workers_.at(index) = std::make_unique<Subprocess>(
      worker_argv_.at(index),
      absl::StrCat(dir_.path(), "/worker", index, ".", ++worker_starts_.at(index), ".log"));
}

int LocalCluster::WorkerPort(size_t index) {
  const std::string path = absl::StrCat(dir_.path(), "/worker", index, ".port");
  WaitFor([&] { return ReadPort(path) > 0 || !workers_.at(index)->running(); }, absl::Seconds(20));
  return ReadPort(path);
}

CommandResult LocalCluster::Ctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {binaries_.ctl, "--controller=" + address(),
                                   "--token_file=" + state_dir_ + "/token"};
  argv.insert(argv.end(), client_flags_.begin(), client_flags_.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

CommandResult LocalCluster::CtlWithToken(const std::string& token,
                                         const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {binaries_.ctl, "--controller=" + address(),
                                   "--token=" + token};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

}  // namespace rlhfd::testing

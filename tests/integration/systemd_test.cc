// The daemons under systemd: the units in deploy/systemd pass `systemd-analyze verify`, and the
// controller and a worker speak the notify protocol to a real NOTIFY_SOCKET as a Type=notify
// unit with a watchdog needs: READY=1 once serving, WATCHDOG=1 at half of WATCHDOG_USEC (none
// while the process is stopped), STOPPING=1 on SIGTERM, every datagram from the main process.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/util/files.h"
#include "tests/support/subprocess.h"

namespace rlhfd::testing {
namespace {

// WATCHDOG_USEC of the daemons under test: pings every 200 ms.
constexpr int kWatchdogUsec = 400000;

struct Datagram {
  std::string text;
  pid_t sender = -1;
};

// The socket systemd listens on for a unit's notifications (AF_UNIX datagrams), with the
// sender's credentials, as systemd checks them for NotifyAccess=main.
class NotifySocket {
 public:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    REQUIRE(path_.size() < sizeof(address.sun_path));
    std::copy(path_.begin(), path_.end(), address.sun_path);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    const int on = 1;
    REQUIRE(::setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) == 0);
  }
  ~NotifySocket() { ::close(fd_); }
  const std::string& path() const { return path_; }

  // The next datagram within `timeout`, or nullopt.
  std::optional<Datagram> Receive(absl::Duration timeout) {
    timeval wait{};
    wait.tv_sec = absl::ToInt64Seconds(timeout);
    wait.tv_usec = absl::ToInt64Microseconds(timeout) % 1000000;
    if (wait.tv_sec == 0 && wait.tv_usec == 0) wait.tv_usec = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    char buffer[4096];
    iovec io{buffer, sizeof(buffer)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t got = ::recvmsg(fd_, &message, 0);
    if (got < 0) return std::nullopt;
    Datagram datagram{std::string(buffer, static_cast<size_t>(got))};
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred credentials{};
        std::memcpy(&credentials, CMSG_DATA(c), sizeof(credentials));
        datagram.sender = credentials.pid;
      }
    }
    return datagram;
  }

  // Datagrams until one contains `text` (true) or `timeout` passes (false); every one is
  // checked to come from `pid`.
  bool WaitFor(const std::string& text, pid_t pid, absl::Duration timeout,
               std::vector<std::string>* seen = nullptr) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      const std::optional<Datagram> datagram = Receive(deadline - absl::Now());
      if (!datagram) break;
      CHECK(datagram->sender == pid);
      if (seen != nullptr) seen->push_back(datagram->text);
      if (absl::StrContains(datagram->text, text)) return true;
    }
    return false;
  }

  // How many WATCHDOG=1 arrive within `window`.
  int CountPings(absl::Duration window) {
    int pings = 0;
    const absl::Time deadline = absl::Now() + window;
    while (absl::Now() < deadline) {
      const std::optional<Datagram> datagram = Receive(deadline - absl::Now());
      if (!datagram) break;
      pings += datagram->text == "WATCHDOG=1" ? 1 : 0;
    }
    return pings;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

std::vector<std::string> UnderSystemd(const NotifySocket& socket, std::vector<std::string> argv) {
  std::vector<std::string> with = {"/usr/bin/env", "NOTIFY_SOCKET=" + socket.path(),
                                   absl::StrCat("WATCHDOG_USEC=", kWatchdogUsec)};
  with.insert(with.end(), argv.begin(), argv.end());
  return with;
}

// READY=1 with `status`, then the watchdog's pings, none while stopped, STOPPING=1 on SIGTERM.
void CheckNotifyLifecycle(NotifySocket& socket, Subprocess& daemon, const std::string& status) {
  std::vector<std::string> seen;
  INFO(daemon.ReadLog());
  REQUIRE(socket.WaitFor("READY=1", daemon.pid(), absl::Seconds(20), &seen));
  CHECK(absl::StrContains(seen.back(), "STATUS=" + status));
  // Half of WATCHDOG_USEC: about 10 in 2 s.
  const int pings = socket.CountPings(absl::Seconds(2));
  CHECK(pings >= 6);
  CHECK(pings <= 14);
  // A stopped process sends nothing: what makes systemd restart a hung daemon.
  REQUIRE(::kill(daemon.pid(), SIGSTOP) == 0);
  while (socket.Receive(absl::Milliseconds(50))) {
  }
  CHECK(socket.CountPings(absl::Seconds(1)) == 0);
  REQUIRE(::kill(daemon.pid(), SIGCONT) == 0);
  CHECK(socket.CountPings(absl::Seconds(1)) >= 2);
  ::kill(daemon.pid(), SIGTERM);
  CHECK(socket.WaitFor("STOPPING=1", daemon.pid(), absl::Seconds(10)));
  CHECK(daemon.Wait(absl::Seconds(30)) == 0);
}

TEST_CASE("the systemd units pass systemd-analyze verify", "[systemd]") {
  TempDir dir;
  // The units as installed, with ExecStart pointing at this build's binaries (verify checks
  // that they are executables).
  const std::string source = std::string(RLHFD_SOURCE_DIR) + "/deploy/systemd/";
  for (const auto& [unit, binary] : {std::pair{"rlhfd-controller.service", RLHFD_CONTROLLER_BIN},
                                     std::pair{"rlhfd-worker@.service", RLHFD_WORKER_BIN}}) {
    const absl::StatusOr<std::string> read = ReadFileToString(source + unit);
    REQUIRE(read.ok());
    const std::string& text = *read;
    REQUIRE(absl::StrContains(text, "Type=notify"));
    REQUIRE(absl::StrContains(text, "WatchdogSec="));
    REQUIRE(absl::StrContains(text, "Restart=on-failure"));
    REQUIRE(absl::StrContains(text, "EnvironmentFile="));
    // A sandboxed tool call the OOM killer ends must not stop the worker's unit.
    if (absl::StrContains(unit, "worker")) REQUIRE(absl::StrContains(text, "OOMPolicy=continue"));
    const std::string installed = absl::StrReplaceAll(
        text, {{absl::StrCat("/opt/rlhfd/bin/",
                             absl::StripSuffix(absl::StripSuffix(unit, "@.service"), ".service")),
                binary}});
    REQUIRE(installed != text);
    REQUIRE(WriteFileAtomically(dir.path() + "/" + unit, installed).ok());
  }
  const CommandResult verified =
      RunCommand({"/usr/bin/systemd-analyze", "verify", "--man=no", "./rlhfd-controller.service",
                  "./rlhfd-worker@0.service"},
                 absl::Seconds(60), dir.path());
  INFO(verified.out << verified.err);
  CHECK(verified.exit_code == 0);
  CHECK(verified.err.empty());  // warnings (an unknown key, a bad value) go here, exit code 0
  // The check is real: a broken unit is reported.
  REQUIRE(WriteFileAtomically(dir.path() + "/broken.service",
                              "[Service]\nType=notifyy\nExecStart=/nonexistent/rlhfd\n")
              .ok());
  const CommandResult broken =
      RunCommand({"/usr/bin/systemd-analyze", "verify", "--man=no", "./broken.service"},
                 absl::Seconds(60), dir.path());
  CHECK((broken.exit_code != 0 || !broken.err.empty()));
}

TEST_CASE("controller and worker speak sd_notify to a real NOTIFY_SOCKET", "[systemd]") {
  TempDir dir;
  NotifySocket controller_socket(dir.path() + "/controller.notify");
  const std::string port_file = dir.path() + "/controller.port";
  Subprocess controller(
      UnderSystemd(controller_socket,
                   {RLHFD_CONTROLLER_BIN, "--listen=127.0.0.1:0",
                    "--state_dir=" + dir.path() + "/state", "--port_file=" + port_file}),
      dir.path() + "/controller.log");
  SECTION("the controller") {
    CheckNotifyLifecycle(controller_socket, controller, "serving on port");
  }
  SECTION("a worker") {
    REQUIRE(controller_socket.WaitFor("READY=1", controller.pid(), absl::Seconds(20)));
    // As systemd does, keep reading the controller's messages meanwhile.
    std::atomic<bool> done{false};
    std::thread reader([&] {
      while (!done) controller_socket.Receive(absl::Milliseconds(100));
    });
    const absl::Cleanup stop_reading = [&] {
      done = true;
      reader.join();
    };
    const absl::StatusOr<std::string> port = ReadFileToString(port_file, 64);
    REQUIRE(port.ok());
    NotifySocket worker_socket(dir.path() + "/worker.notify");
    Subprocess worker(
        UnderSystemd(worker_socket, {RLHFD_WORKER_BIN,
                                     "--controller=127.0.0.1:" +
                                         std::string(absl::StripTrailingAsciiWhitespace(*port)),
                                     "--token_file=" + dir.path() + "/state/token", "--device=cpu",
                                     "--worker_id=notify-worker"}),
        dir.path() + "/worker.log");
    CheckNotifyLifecycle(worker_socket, worker, "notify-worker serving on port");
  }
}

// sd_notify blocks while systemd has not read earlier messages: an unread socket must stop
// neither the controller's work nor its exit.
TEST_CASE("a controller whose notify socket is not read keeps serving and stops", "[systemd]") {
  TempDir dir;
  NotifySocket socket(dir.path() + "/controller.notify");
  const std::string port_file = dir.path() + "/controller.port";
  Subprocess controller(
      UnderSystemd(socket, {RLHFD_CONTROLLER_BIN, "--listen=127.0.0.1:0",
                            "--state_dir=" + dir.path() + "/state", "--port_file=" + port_file}),
      dir.path() + "/controller.log");
  REQUIRE(socket.WaitFor("READY=1", controller.pid(), absl::Seconds(20)));
  // Pings every 200 ms fill the socket's queue (10 datagrams by default) in about 2 s.
  absl::SleepFor(absl::Seconds(4));
  const absl::StatusOr<std::string> port = ReadFileToString(port_file, 64);
  REQUIRE(port.ok());
  for (int i = 0; i < 3; ++i) {
    const CommandResult cluster = RunCommand(
        {RLHFD_CTL_BIN,
         "--controller=127.0.0.1:" + std::string(absl::StripTrailingAsciiWhitespace(*port)),
         "--token_file=" + dir.path() + "/state/token", "--timeout=5s", "cluster"});
    INFO(cluster.out << cluster.err);
    CHECK(cluster.exit_code == 0);
  }
  ::kill(controller.pid(), SIGTERM);
  CHECK(controller.Wait(absl::Seconds(20)) == 0);
}

}  // namespace
}  // namespace rlhfd::testing

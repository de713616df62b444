// A real rlhfd-controller's REST gateway against clients without a token that try to exhaust
// it: header bombs (many lines, huge lines), chunked bodies far over the 1 MiB limit, and
// hundreds of slow clients. Each is cut off at the door with 431/413/408 or a closed connection;
// the controller stays small, and /healthz and the routes keep answering meanwhile.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/files.h"
#include "tests/support/cluster_fixture.h"

namespace rlhfd::testing {
namespace {

// A field of /proc/PID/status in bytes ("VmHWM": the peak resident memory).
int64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::string digits;
    for (char c : line) {
      if (absl::ascii_isdigit(static_cast<unsigned char>(c))) digits += c;
    }
    int64_t kib = 0;
    return absl::SimpleAtoi(digits, &kib) ? kib * 1024 : -1;
  }
  return -1;
}

class Gateway {
 public:
  Gateway()
      : cluster_({RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN}, absl::Milliseconds(500),
                 absl::Seconds(3)) {
    cluster_.SetExtraFlags(
        {"--http_listen=127.0.0.1:0", "--http_port_file=" + cluster_.state_dir() + "/http.port"},
        {});
    std::string error;
    INFO(error);
    REQUIRE(cluster_.StartController(&error));
    REQUIRE(WaitFor([&] { return PathExists(cluster_.state_dir() + "/http.port"); },
                    absl::Seconds(10)));
    auto port = ReadFileToString(cluster_.state_dir() + "/http.port", 64);
    REQUIRE(port.ok());
    port_ = std::stoi(*port);
    auto token = ReadFileToString(cluster_.state_dir() + "/token");
    REQUIRE(token.ok());
    token_ = std::string(absl::StripAsciiWhitespace(*token));
  }

  int port() const { return port_; }
  pid_t pid() { return cluster_.controller()->pid(); }
  bool running() { return cluster_.controller()->running(); }

  // GET `path` on a fresh connection (with the token unless /healthz); the status (-1: no
  // answer within `patience`) and how long it took.
  std::pair<int, absl::Duration> Get(const std::string& path,
                                     absl::Duration patience = absl::Seconds(5)) {
    httplib::Client client("127.0.0.1", port_);
    const int64_t ms = absl::ToInt64Milliseconds(patience);
    client.set_connection_timeout(ms / 1000, (ms % 1000) * 1000);
    client.set_read_timeout(ms / 1000, (ms % 1000) * 1000);
    const httplib::Headers auth = {{"Authorization", "Bearer " + token_}};
    const absl::Time start = absl::Now();
    const httplib::Result result =
        path == "/healthz" ? client.Get(path.c_str()) : client.Get(path.c_str(), auth);
    return {result ? result->status : -1, absl::Now() - start};
  }

 private:
  LocalCluster cluster_;
  int port_ = 0;
  std::string token_;
};

// A TCP connection from `source` (any 127.x.y.z is this host) to the gateway.
int Connect(int port, const std::string& source = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  REQUIRE(inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0);
  timeval timeout{.tv_sec = 20, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// Sends `head`, then `piece` over and over up to `total` bytes or until the server stops
// taking them; then reads what it answered. The answer's first line, or "closed".
std::string Bomb(int port, const std::string& head, const std::string& piece, size_t total) {
  const int fd = Connect(port);
  bool open = send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size());
  for (size_t sent = 0; open && sent < total; sent += piece.size()) {
    open = send(fd, piece.data(), piece.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(piece.size());
  }
  shutdown(fd, SHUT_WR);  // all sent: the server need not wait for more
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) answer.append(buffer, n);
  close(fd);
  if (answer.empty()) return "closed";
  return answer.substr(0, answer.find("\r\n"));
}

std::string Lines(size_t bytes) {
  std::string out;
  for (int i = 0; out.size() < bytes; ++i) absl::StrAppend(&out, "X-Fill-", i, ": v\r\n");
  return out;
}

std::string Chunks(size_t bytes) {
  const std::string chunk = absl::StrCat("10000\r\n", std::string(0x10000, 'c'), "\r\n");
  std::string out;
  while (out.size() < bytes) out += chunk;
  return out;
}

TEST_CASE("Header and chunked bombs are refused before the token; the controller stays small",
          "[gateway][hostile]") {
  Gateway gateway;
  const int port = gateway.port();
  const std::string get = "GET /v1/cluster HTTP/1.1\r\nHost: rlhfd\r\n";
  const std::string post =
      "POST /v1/jobs HTTP/1.1\r\nHost: rlhfd\r\nTransfer-Encoding: chunked\r\n\r\n";

  // Small enough to be read to the end: the client sees the status and why.
  CHECK(Bomb(port, get, Lines(64 << 10), 64 << 10) ==
        "HTTP/1.1 431 Request Header Fields Too Large");
  CHECK(Bomb(port, get + "X-Huge: ", std::string(64 << 10, 'h'), 256 << 10) ==
        "HTTP/1.1 431 Request Header Fields Too Large");
  CHECK(Bomb(port, post, Chunks(1 << 20), 4 << 20) == "HTTP/1.1 413 Content Too Large");
  {
    httplib::Client client("127.0.0.1", port);
    const httplib::Result many = client.Get("/v1/cluster", [] {
      httplib::Headers headers;
      for (int i = 0; i < 200; ++i) headers.emplace(absl::StrCat("X-Many-", i), "v");
      return headers;
    }());
    REQUIRE(many);
    CHECK(many->status == 431);
    CHECK_THAT(many->body, Catch::Contains("\"code\":\"RESOURCE_EXHAUSTED\""));
    CHECK_THAT(many->body, Catch::Contains("header lines"));
  }

  // The bombs of the issue, all at once: 8 connections each sending 256 MiB of header lines or
  // of one header line, and 4 chunked POSTs of 512 MiB.
  std::vector<std::string> answers(12);
  std::vector<std::thread> bombs;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 4; ++i) {
    bombs.emplace_back([&, i] { answers[i] = Bomb(port, get, Lines(1 << 20), 256u << 20); });
    bombs.emplace_back([&, i] {
      answers[4 + i] = Bomb(port, get + "X-Huge: ", std::string(1 << 20, 'h'), 256u << 20);
    });
    bombs.emplace_back([&, i] { answers[8 + i] = Bomb(port, post, Chunks(1 << 20), 512u << 20); });
  }
  for (std::thread& bomb : bombs) bomb.join();
  const absl::Duration took = absl::Now() - start;
  const int64_t peak = StatusBytes(gateway.pid(), "VmHWM");
  WARN("bombs took " << absl::FormatDuration(took) << "; controller peak RSS (VmHWM) "
                     << (peak >> 20) << " MiB; answers: " << absl::StrJoin(answers, ", "));
  for (size_t i = 0; i < answers.size(); ++i) {
    INFO("bomb " << i << ": " << answers[i]);
    const std::string refused = i < 8 ? "HTTP/1.1 431" : "HTTP/1.1 413";
    CHECK((answers[i] == "closed" || absl::StartsWith(answers[i], refused)));
  }
  REQUIRE(gateway.running());
  CHECK(peak > 0);
  CHECK(peak < (200 << 20));
  CHECK(took < absl::Seconds(60));
  CHECK(gateway.Get("/healthz").first == 200);
  CHECK(gateway.Get("/v1/cluster").first == 200);
}

// Connections that send a request head one byte a second, from `sources`; probes /healthz and
// the routes while they hang.
void SlowClients(Gateway& gateway, const std::vector<std::string>& sources) {
  const std::string head = "GET /v1/cluster HTTP/1.1\r\nHost: rlhfd\r\nX-Slow: ";
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i) fds.push_back(Connect(gateway.port(), sources[i % sources.size()]));
  std::vector<size_t> sent(fds.size(), 0);
  std::vector<bool> open(fds.size(), true);
  std::vector<absl::Duration> health;
  std::vector<std::pair<std::string, int>> routes;
  const absl::Time start = absl::Now();
  // Past the 10 s request-head deadline, so that it is seen to end every slow head.
  while (absl::Now() - start < absl::Seconds(14)) {
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!open[i]) continue;
      char peek[64];
      const ssize_t got = recv(fds[i], peek, sizeof(peek), MSG_DONTWAIT);
      if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {  // answered (408) or closed
        open[i] = false;
        continue;
      }
      const char c = head[std::min(sent[i], head.size() - 1)];
      if (send(fds[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) ++sent[i];
    }
    const auto [status, took] = gateway.Get("/healthz", absl::Seconds(5));
    CHECK(status == 200);
    health.push_back(took);
    for (const char* path : {"/", "/metrics", "/v1/jobs"}) {
      routes.emplace_back(path, gateway.Get(path, absl::Seconds(10)).first);
    }
    absl::SleepFor(absl::Seconds(1));
  }
  const size_t still_open = std::count(open.begin(), open.end(), true);
  std::string latencies;
  for (absl::Duration took : health) absl::StrAppend(&latencies, absl::FormatDuration(took), " ");
  WARN("/healthz took " << latencies << "; slow connections still open after 14 s: " << still_open);
  CHECK(health.size() >= 5);
  for (absl::Duration took : health) CHECK(took < absl::Seconds(1));
  for (const auto& [path, status] : routes) {
    INFO(path);
    CHECK(status == 200);
  }
  CHECK(still_open == 0);  // the head deadline ended every one of them
  for (int fd : fds) close(fd);
  REQUIRE(gateway.running());
}

TEST_CASE("300 slow clients from one address leave /healthz and the routes answering",
          "[gateway][hostile]") {
  Gateway gateway;
  SlowClients(gateway, {"127.0.0.1"});
}

TEST_CASE("300 slow clients from ten addresses leave /healthz and the routes answering",
          "[gateway][hostile]") {
  Gateway gateway;
  std::vector<std::string> sources;
  for (int i = 2; i < 12; ++i) sources.push_back(absl::StrCat("127.0.0.", i));
  SlowClients(gateway, sources);
}

}  // namespace
}  // namespace rlhfd::testing

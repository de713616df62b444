// The REST gateway's own HTTP/1.1 server (controller/gateway/http_server.h): the parser's bounds,
// fed bytes directly, and the server's connection caps and deadlines over loopback sockets.
#include "controller/gateway/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"

namespace rlhfd::controller {
namespace {

using State = RequestParser::State;

// Feeds `input` whole, then byte by byte, and checks both give the same outcome.
struct Parsed {
  State state;
  size_t used;
  int error_status = 0;
  std::string error;
  HttpRequest request;
};
Parsed Parse(const std::string& input, const HttpLimits& limits = {}) {
  RequestParser whole(limits);
  Parsed out{.state = State::kHead, .used = whole.Consume(input)};
  out.state = whole.state();
  out.error_status = whole.error_status();
  out.error = std::string(whole.error().message());
  RequestParser bytes(limits);
  size_t used = 0;
  for (size_t i = 0;
       i < input.size() && bytes.state() != State::kDone && bytes.state() != State::kError; ++i) {
    used += bytes.Consume(input.substr(i, 1));
  }
  CHECK(bytes.state() == out.state);
  CHECK(bytes.error_status() == out.error_status);
  if (out.state == State::kDone) {
    CHECK(used == out.used);
    const HttpRequest one = bytes.Take();
    out.request = whole.Take();
    CHECK(one.body == out.request.body);
    CHECK(one.path == out.request.path);
  }
  return out;
}

TEST_CASE("The parser reads method, path, query, headers and body", "[http_server]") {
  const std::string first =
      "POST /v1/jobs%2Fx?name=a+b.yaml&override=k%3Dv&override=x=1&flag HTTP/1.1\r\n"
      "Host: h\r\nAuthorization:  Bearer t \r\nContent-Length: 5\r\n\r\nhello";
  const Parsed parsed = Parse(first + "GET /next HTTP/1.1\r\n\r\n");
  REQUIRE(parsed.state == State::kDone);
  CHECK(parsed.used == first.size());  // the rest is the next request's
  const HttpRequest& request = parsed.request;
  CHECK(request.method == "POST");
  CHECK(request.path == "/v1/jobs%2Fx");  // as sent: the gateway decodes a route's ids
  REQUIRE(request.Param("name") != nullptr);
  CHECK(*request.Param("name") == "a b.yaml");
  CHECK(request.Params("override") == std::vector<std::string>{"k=v", "x=1"});
  CHECK(*request.Param("flag") == "");
  REQUIRE(request.Header("authorization") != nullptr);
  CHECK(*request.Header("AUTHORIZATION") == "Bearer t");
  CHECK(request.body == "hello");
}

TEST_CASE("The parser decodes chunked bodies and honours Expect and Connection", "[http_server]") {
  const Parsed chunked = Parse(
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nTrailer: x\r\n\r\n");
  REQUIRE(chunked.state == State::kDone);
  CHECK(chunked.request.body == "hello!");

  RequestParser expect({});
  expect.Consume("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n");
  CHECK(expect.state() == State::kBody);
  CHECK(expect.expects_continue());
  CHECK(expect.keep_alive());
  RequestParser old({});
  old.Consume("GET / HTTP/1.0\r\n\r\n");
  CHECK(old.state() == State::kDone);
  CHECK_FALSE(old.keep_alive());
  RequestParser closing({});
  closing.Consume("GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
  CHECK_FALSE(closing.keep_alive());
}

TEST_CASE("The parser refuses heads and bodies over its limits before holding them",
          "[http_server]") {
  HttpLimits limits;
  SECTION("too many header lines: 431") {
    std::string head = "GET / HTTP/1.1\r\n";
    for (size_t i = 0; i <= limits.max_header_count; ++i) head += "X: y\r\n";
    const Parsed parsed = Parse(head, limits);
    CHECK(parsed.state == State::kError);
    CHECK(parsed.error_status == 431);
    CHECK_THAT(parsed.error, Catch::Contains("header lines"));
  }
  SECTION("one huge header line: 431, having taken at most the limit") {
    RequestParser parser(limits);
    const std::string head = "GET / HTTP/1.1\r\nX: " + std::string(1 << 20, 'a');
    CHECK(parser.Consume(head) <= limits.max_head_bytes + 1);
    CHECK(parser.state() == State::kError);
    CHECK(parser.error_status() == 431);
  }
  SECTION("a Content-Length over the body limit: 413 before any of the body") {
    const Parsed parsed = Parse(
        absl::StrCat("POST / HTTP/1.1\r\nContent-Length: ", limits.max_body_bytes + 1, "\r\n\r\n"),
        limits);
    CHECK(parsed.state == State::kError);
    CHECK(parsed.error_status == 413);
    CHECK_THAT(parsed.error, Catch::Contains("1 MiB"));
  }
  SECTION("chunks adding up past the body limit: 413 at the chunk that crosses it") {
    RequestParser parser(limits);
    const std::string chunk =
        absl::StrCat(absl::Hex(64 << 10), "\r\n", std::string(64 << 10, 'c'), "\r\n");
    parser.Consume("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    size_t sent = 0;
    while (parser.state() == State::kBody && sent < (64u << 20)) {
      parser.Consume(chunk);
      sent += chunk.size();
    }
    CHECK(parser.state() == State::kError);
    CHECK(parser.error_status() == 413);
    CHECK(sent <= limits.max_body_bytes + chunk.size());
  }
  SECTION("a huge chunk size: 413 at once") {
    const Parsed parsed =
        Parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffff\r\n", limits);
    CHECK(parsed.error_status == 413);
  }
}

TEST_CASE("The parser refuses malformed requests with 400 or 501", "[http_server]") {
  const std::vector<std::pair<std::string, int>> cases = {
      {"GET\r\n\r\n", 400},
      {"GET http://host/ HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 400},
      {"GET /%zz HTTP/1.1\r\n\r\n", 400},
      {"GET /?a=%4 HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nNo colon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\x01\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n", 400},
  };
  for (const auto& [input, status] : cases) {
    INFO(input);
    const Parsed parsed = Parse(input);
    CHECK(parsed.state == State::kError);
    CHECK(parsed.error_status == status);
    CHECK_FALSE(parsed.error.empty());
  }
}

// ---- the server over loopback ----

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

void Send(int fd, const std::string& data) {
  REQUIRE(send(fd, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size()));
}

// Everything until the server closes (or 10 s pass).
std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) out.append(buffer, n);
  return out;
}

// Reads one reply at a time from a kept-alive connection (bodies under 4 KiB).
class Replies {
 public:
  explicit Replies(int fd) : fd_(fd) {}
  std::string Next() {
    char buffer[4096];
    while (true) {
      const size_t end = buffered_.find("\r\n\r\n");
      if (end != std::string::npos) {
        const size_t at = buffered_.find("Content-Length: ");
        const size_t length = at < end ? std::stoul(buffered_.substr(at + 16)) : 0;
        if (buffered_.size() >= end + 4 + length) {
          std::string reply = buffered_.substr(0, end + 4 + length);
          buffered_.erase(0, reply.size());
          return reply;
        }
      }
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) return std::exchange(buffered_, "");
      buffered_.append(buffer, n);
    }
  }

 private:
  int fd_;
  std::string buffered_;
};

struct TestServer {
  explicit TestServer(HttpServerOptions options) {
    auto started = HttpServer::Start(
        std::move(options),
        [this](const HttpRequest& request) {
          if (request.path == "/block") release.WaitForNotification();
          HttpResponse response;
          response.body = absl::StrCat(request.method, " ", request.path, " ", request.body.size());
          return response;
        },
        [](int status, const absl::Status& why) {
          HttpResponse response;
          response.status = status;
          response.body = std::string(why.message());
          return response;
        });
    REQUIRE(started.ok());
    server = *std::move(started);
  }
  ~TestServer() {
    if (!release.HasBeenNotified()) release.Notify();
  }
  absl::Notification release;
  std::unique_ptr<HttpServer> server;
};

TEST_CASE("The server keeps connections alive, pipelines and answers the health path",
          "[http_server]") {
  TestServer test({});
  const int fd = Connect(test.server->port());
  Replies replies(fd);
  Send(fd, "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz");
  CHECK_THAT(replies.Next(), Catch::EndsWith("GET /a 0"));
  CHECK_THAT(replies.Next(), Catch::EndsWith("POST /b 3"));
  Send(fd, "POST /c HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  CHECK(replies.Next() == "HTTP/1.1 100 Continue\r\n\r\n");
  Send(fd, "hi");
  CHECK_THAT(replies.Next(), Catch::EndsWith("POST /c 2"));
  Send(fd, "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string health = ReadAll(fd);
  CHECK_THAT(health, Catch::StartsWith("HTTP/1.1 200 OK"));
  CHECK_THAT(health, Catch::EndsWith("\r\n\r\nok\n"));
  close(fd);
}

TEST_CASE("A request head that is not in by its deadline gets 408", "[http_server]") {
  HttpServerOptions options;
  options.limits.head_timeout = absl::Milliseconds(300);
  TestServer test(options);
  const int fd = Connect(test.server->port());
  const absl::Time start = absl::Now();
  // A byte every 100 ms keeps each read short; the whole head is still late.
  std::string reply;
  for (const char c : std::string("GET / HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaa")) {
    if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
    absl::SleepFor(absl::Milliseconds(100));
    if (absl::Now() - start > absl::Seconds(2)) break;
  }
  reply = ReadAll(fd);
  CHECK_THAT(reply, Catch::StartsWith("HTTP/1.1 408"));
  CHECK(absl::Now() - start < absl::Seconds(5));
  close(fd);
}

TEST_CASE("Over the per-address cap a new connection replaces the longest waiting one",
          "[http_server]") {
  HttpServerOptions options;
  options.max_connections_per_address = 2;
  options.handler_threads = 2;
  TestServer test(options);
  const int port = test.server->port();
  const int oldest = Connect(port);
  absl::SleepFor(absl::Milliseconds(50));
  const int second = Connect(port);
  absl::SleepFor(absl::Milliseconds(50));
  const int third = Connect(port);  // takes the oldest's place
  Send(third, "GET /x HTTP/1.1\r\n\r\n");
  CHECK_THAT(Replies(third).Next(), Catch::EndsWith("GET /x 0"));
  CHECK(ReadAll(oldest).empty());  // closed without a word
  Send(second, "GET /y HTTP/1.1\r\n\r\n");
  CHECK_THAT(Replies(second).Next(), Catch::EndsWith("GET /y 0"));
  for (int fd : {oldest, second, third}) close(fd);

  // Both connections busy in handlers: the next one is refused with 503.
  const int busy1 = Connect(port);
  const int busy2 = Connect(port);
  Send(busy1, "GET /block HTTP/1.1\r\n\r\n");
  Send(busy2, "GET /block HTTP/1.1\r\n\r\n");
  absl::SleepFor(absl::Milliseconds(200));
  const int refused = Connect(port);
  CHECK_THAT(ReadAll(refused), Catch::StartsWith("HTTP/1.1 503"));
  test.release.Notify();
  CHECK_THAT(Replies(busy1).Next(), Catch::EndsWith("GET /block 0"));
  for (int fd : {busy1, busy2, refused}) close(fd);
}

TEST_CASE("Bodies over the server-wide budget are refused with 503", "[http_server]") {
  HttpServerOptions options;
  options.max_bodies_held_bytes = 100 << 10;
  TestServer test(options);
  const int port = test.server->port();
  const std::string head = "POST /upload HTTP/1.1\r\nContent-Length: 81920\r\n\r\n";
  const int first = Connect(port);
  Send(first, head + std::string(60 << 10, 'a'));  // 60 KiB held, 20 KiB to come
  absl::SleepFor(absl::Milliseconds(200));
  const int second = Connect(port);
  Send(second, head + std::string(60 << 10, 'b'));  // 120 KiB: over
  shutdown(second, SHUT_WR);
  const std::string refused = ReadAll(second);
  CHECK_THAT(refused, Catch::StartsWith("HTTP/1.1 503"));
  CHECK_THAT(refused, Catch::Contains("request bodies at once"));
  Send(first, std::string(20 << 10, 'a'));
  CHECK_THAT(Replies(first).Next(), Catch::EndsWith("POST /upload 81920"));
  // Once answered, the first body no longer counts.
  const int third = Connect(port);
  Send(third, head + std::string(80 << 10, 'c'));
  CHECK_THAT(Replies(third).Next(), Catch::EndsWith("POST /upload 81920"));
  for (int fd : {first, second, third}) close(fd);
}

TEST_CASE("HEAD gets the GET's head without the body, and the next reply stays in step",
          "[http_server]") {
  TestServer test({});
  const int fd = Connect(test.server->port());
  Send(fd,
       "HEAD /healthz HTTP/1.1\r\n\r\nHEAD /a HTTP/1.1\r\n\r\n"
       "GET /a HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string all = ReadAll(fd);
  close(fd);
  // Three replies back to back: the two heads end where the next status line starts.
  const std::vector<std::string> replies = absl::StrSplit(all, "HTTP/1.1 200 OK");
  REQUIRE(replies.size() == 4);
  CHECK_THAT(replies[1], Catch::Contains("Content-Length: 3\r\n") &&
                             Catch::EndsWith("Connection: keep-alive\r\n\r\n"));
  CHECK_THAT(replies[2], Catch::Contains("Content-Length: 9\r\n") &&  // "HEAD /a 0"
                             Catch::EndsWith("Connection: keep-alive\r\n\r\n"));
  CHECK_THAT(replies[3], Catch::EndsWith("\r\n\r\nGET /a 0"));
}

// A client that keeps its socket full of requests the I/O thread answers itself: before the
// I/O thread took turns, it answered that client until its socket ran dry, which it never did,
// and no other client was served (nor new connections accepted) while the flood lasted.
TEST_CASE("A client flooding the health path does not hold other clients up", "[http_server]") {
  TestServer test({});
  const int port = test.server->port();
  const int flood = Connect(port);
  std::atomic<bool> stop = false;
  std::thread reader([&] {
    char sink[1 << 16];
    while (!stop && recv(flood, sink, sizeof(sink), 0) > 0) {
    }
  });
  std::thread writer([&] {
    std::string requests;
    while (requests.size() < (1 << 16)) requests += "GET /healthz HTTP/1.1\r\n\r\n";
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (!stop && absl::Now() < until) {
      if (send(flood, requests.data(), requests.size(), MSG_NOSIGNAL) < 0) break;
    }
  });
  absl::SleepFor(absl::Milliseconds(300));  // the flood is on
  const absl::Time start = absl::Now();
  const int other = Connect(port);
  Send(other, "GET /a HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string reply = ReadAll(other);  // at most 10 s (the socket's receive timeout)
  const absl::Duration waited = absl::Now() - start;
  stop = true;
  shutdown(flood, SHUT_RDWR);
  writer.join();
  reader.join();
  close(flood);
  close(other);
  INFO("answered after " << absl::FormatDuration(waited));
  CHECK_THAT(reply, Catch::EndsWith("GET /a 0"));
  CHECK(waited < absl::Seconds(5));
}

}  // namespace
}  // namespace rlhfd::controller

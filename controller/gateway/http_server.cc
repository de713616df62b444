// HttpServer (http_server.h): the I/O thread (accept under the connection caps, requests read
// under the byte, body and time limits, replies out), and the handler pool. A connection's bytes
// on the wire, plain or TLS, are http_connection.h's.
#include "controller/gateway/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "controller/gateway/http_connection.h"

namespace rlhfd::controller {
namespace {

constexpr size_t kReadChunk = 16 << 10;
// Socket reads one connection gets each time the I/O thread turns to it: a client that keeps
// its socket full (pipelined requests the thread answers itself, a stream of blank lines)
// then waits its turn like the others instead of holding the thread, and with it every other
// client, the handlers' replies, new connections and shutdown.
constexpr int kReadsPerTurn = 4;

}  // namespace

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler, HttpErrorReply error_reply)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        error_reply_(std::move(error_reply)) {}

  ~Impl() {
    stopping_ = true;
    Wake();
    if (io_thread_.joinable()) io_thread_.join();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      handlers_stopping_ = true;
    }
    work_ready_.notify_all();
    for (std::thread& thread : handler_threads_) thread.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (tls_) SSL_CTX_free(tls_);
  }

  absl::Status Open() {
    if (!options_.tls_cert_file.empty()) {
      absl::StatusOr<SSL_CTX*> tls = MakeServerTls(options_.tls_cert_file, options_.tls_key_file);
      if (!tls.ok()) return tls.status();
      tls_ = *tls;
    }
    absl::StatusOr<int> listening = ListenOn(options_.host, options_.port, &port_);
    if (!listening.ok()) return listening.status();
    listen_fd_ = *listening;
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return absl::InternalError("the REST gateway cannot create an eventfd");
    for (int i = 0; i < std::max(1, options_.handler_threads); ++i) {
      handler_threads_.emplace_back([this] { HandlerLoop(); });
    }
    io_thread_ = std::thread([this] { IoLoop(); });
    return absl::OkStatus();
  }

  int port() const { return port_; }

 private:
  using Connection = HttpConnection;
  using Phase = ConnectionPhase;

  void Wake() {
    if (wake_fd_ < 0) return;
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  // ---- the handler pool ----

  void HandlerLoop() {
    while (true) {
      std::pair<uint64_t, HttpRequest> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_ready_.wait(lock, [&] { return handlers_stopping_ || !work_.empty(); });
        if (handlers_stopping_) return;  // queued requests are dropped with their connections
        work = std::move(work_.front());
        work_.pop_front();
      }
      HttpResponse response;
      try {
        response = handler_(work.second);
      } catch (const std::exception& error) {
        RLOG(ERROR) << "REST " << work.second.path.substr(0, 200) << ": " << error.what();
        response = error_reply_(500, absl::InternalError("the request failed; see the log"));
      } catch (...) {
        RLOG(ERROR) << "REST " << work.second.path.substr(0, 200) << ": a non-standard exception";
        response = error_reply_(500, absl::InternalError("the request failed; see the log"));
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.emplace_back(work.first, std::move(response));
      }
      Wake();
    }
  }

  // ---- the I/O thread ----

  void IoLoop() {
    // A write to a peer that has gone raises SIGPIPE on this thread; blocked, it is EPIPE.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    std::vector<pollfd> polled;
    std::vector<uint64_t> ids;
    while (!stopping_) {
      const absl::Time now = absl::Now();
      polled.clear();
      ids.clear();
      polled.push_back({wake_fd_, POLLIN, 0});
      if (now >= accept_paused_until_) polled.push_back({listen_fd_, POLLIN, 0});
      absl::Time next = now + absl::Seconds(1);
      for (auto& [id, c] : connections_) {
        short events = 0;
        switch (c->phase) {
          case Phase::kHandling:
            continue;
          case Phase::kHandshake:
            events = c->ssl_wants_write ? POLLOUT : POLLIN;
            break;
          case Phase::kReading:
          case Phase::kDraining:
            events = POLLIN;
            if (!c->out.empty() || c->ssl_wants_write) events |= POLLOUT;
            break;
          case Phase::kWriting:
            events = c->ssl_wants_read ? POLLIN : POLLOUT;
            break;
        }
        polled.push_back({c->fd, events, 0});
        ids.push_back(id);
        next = std::min(next, c->deadline);
      }
      const int wait_ms =
          static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(next - now) + 1, 0, 1000));
      if (poll(polled.data(), polled.size(), wait_ms) < 0 && errno != EINTR) {
        RLOG(ERROR) << "REST gateway: poll failed: " << std::strerror(errno);
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      if (polled[0].revents != 0) TakeReplies();
      if (polled.size() > 1 && polled[1].fd == listen_fd_ && polled[1].revents != 0) Accept();
      const size_t first = polled.size() - ids.size();
      for (size_t i = 0; i < ids.size(); ++i) {
        if (polled[first + i].revents == 0) continue;
        const auto found = connections_.find(ids[i]);
        if (found != connections_.end()) Advance(*found->second);
      }
      Expire();
    }
    for (auto& [id, connection] : connections_) CloseSocket(*connection);
  }

  void TakeReplies() {
    uint64_t count;
    (void)!read(wake_fd_, &count, sizeof(count));
    std::deque<std::pair<uint64_t, HttpResponse>> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done.swap(done_);
    }
    for (auto& [id, response] : done) {
      const auto found = connections_.find(id);
      if (found == connections_.end() || found->second->phase != Phase::kHandling) continue;
      Connection& c = *found->second;
      Send(c, response, c.keep_alive);
      Advance(c);
    }
  }

  void Accept() {
    while (true) {
      sockaddr_storage peer{};
      socklen_t size = sizeof(peer);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &size,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: retry shortly rather than spin on a listen socket that stays
          // readable.
          RLOG_EVERY_N_SEC(WARNING, 10) << "REST gateway: accept: " << std::strerror(errno);
          accept_paused_until_ = absl::Now() + absl::Milliseconds(100);
        }
        return;
      }
      char text[INET6_ADDRSTRLEN] = "";
      if (peer.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, text, sizeof(text));
      } else {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, text, sizeof(text));
      }
      const std::string address = text;
      const auto counted = per_address_.find(address);
      const bool address_full =
          counted != per_address_.end() && counted->second >= options_.max_connections_per_address;
      if (address_full || connections_.size() >= options_.max_connections) {
        Connection* victim = Oldest(address_full ? &address : nullptr);
        if (victim == nullptr) {
          Refuse(fd, address_full
                         ? absl::StrCat("all ", options_.max_connections_per_address,
                                        " connections from ", address, " are busy with requests")
                         : absl::StrCat("all ", options_.max_connections,
                                        " connections are busy with requests"));
          continue;
        }
        Close(*victim);
      }
      // Small replies go out at once rather than after the peer's delayed ACK (a 40 ms stall).
      const int on = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      auto c = std::make_unique<Connection>(options_.limits);
      c->id = ++last_id_;
      c->fd = fd;
      c->address = address;
      c->waiting_since = absl::Now();
      c->deadline = c->waiting_since + options_.limits.head_timeout;
      if (tls_ != nullptr) {
        c->ssl = SSL_new(tls_);
        if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
          if (c->ssl) SSL_free(c->ssl);
          close(fd);
          continue;
        }
        c->phase = Phase::kHandshake;
      }
      ++per_address_[address];
      connections_.emplace(c->id, std::move(c));
    }
  }

  // The connection (of `address`, or any) that has waited longest for a request; nullptr when
  // every one is busy with a request.
  Connection* Oldest(const std::string* address) {
    Connection* oldest = nullptr;
    for (auto& [id, c] : connections_) {
      if (c->phase == Phase::kHandling || c->phase == Phase::kWriting) continue;
      if (address != nullptr && c->address != *address) continue;
      if (oldest == nullptr || c->waiting_since < oldest->waiting_since) oldest = c.get();
    }
    return oldest;
  }

  void Refuse(int fd, const std::string& why) {
    RLOG_EVERY_N_SEC(WARNING, 10) << "REST gateway: refused a connection: " << why;
    if (tls_ == nullptr) {  // a plain client is told why; a TLS one cannot be before a handshake
      const std::string reply =
          Serialize(error_reply_(503, absl::UnavailableError(absl::StrCat(why, "; retry later"))),
                    false, false);
      (void)!send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close(fd);
  }

  void Expire() {
    const absl::Time now = absl::Now();
    std::vector<Connection*> expired;
    for (auto& [id, c] : connections_) {
      if (c->phase != Phase::kHandling && now >= c->deadline) expired.push_back(c.get());
    }
    for (Connection* c : expired) {
      if (c->phase == Phase::kReading && c->parser.started()) {
        // Told why, once; a client that does not read it in time is closed on the write timeout.
        Send(*c,
             error_reply_(408, absl::DeadlineExceededError(absl::StrCat(
                                   "the request was not received in time (",
                                   absl::FormatDuration(c->seen == RequestParser::State::kBody
                                                            ? options_.limits.body_timeout
                                                            : options_.limits.head_timeout),
                                   "); send it at once"))),
             false);
        Advance(*c);
      } else {
        Close(*c);
      }
    }
  }

  // Counts `bytes` of body as the connection's share of bodies_held_.
  void Hold(Connection& c, size_t bytes) {
    bodies_held_ = bodies_held_ - c.body_held + bytes;
    c.body_held = bytes;
  }

  void Send(Connection& c, const HttpResponse& response, bool keep_alive) {
    Hold(c, 0);                  // the request, if any, is answered
    c.out.erase(0, c.out_sent);  // an interim "100 Continue" may still be on its way
    c.out_sent = 0;
    c.out += Serialize(response, keep_alive, c.head_request);
    c.head_request = false;
    c.keep_alive = keep_alive;
    c.phase = Phase::kWriting;
    c.deadline = absl::Now() + options_.limits.write_timeout;
  }

  void Close(Connection& c) {
    Hold(c, 0);
    CloseSocket(c);
    const auto count = per_address_.find(c.address);
    if (count != per_address_.end() && --count->second == 0) per_address_.erase(count);
    connections_.erase(c.id);  // `c` is gone
  }

  // The reply is out: drain what a refused client still sends, close, or wait for the next
  // request on a kept-alive connection. False when the connection is closed (and gone).
  bool AfterReply(Connection& c) {
    if (c.drain_after_write) {
      c.phase = Phase::kDraining;
      c.deadline = absl::Now() + options_.limits.drain_timeout;
    } else if (!c.keep_alive) {
      Close(c);
      return false;
    } else {
      c.phase = Phase::kReading;
      c.idle = true;
      c.seen = RequestParser::State::kHead;
      c.sent_continue = false;
      c.waiting_since = absl::Now();
      c.deadline = c.waiting_since + options_.limits.idle_timeout;
    }
    return true;
  }

  // Reads and discards until the client stops sending (for now), closes, or has sent
  // max_drain_bytes; then the connection is closed.
  void Drain(Connection& c) {
    char discard[kReadChunk];
    while (true) {
      size_t got = 0;
      const Io read = Read(c, discard, sizeof(discard), &got);
      if (read == Io::kAgain) return;
      c.drained += got;
      if (read == Io::kClosed || c.drained >= options_.limits.max_drain_bytes) return Close(c);
    }
  }

  // Moves the connection on as far as it can without blocking; closes it when it is done.
  void Advance(Connection& c) {
    if (c.phase == Phase::kHandshake) {
      const Io shaken = Handshake(c);
      if (shaken == Io::kClosed) return Close(c);
      if (shaken == Io::kAgain) return;
      c.phase = Phase::kReading;
    }
    int reads_left = kReadsPerTurn;
    while (true) {
      if (!c.out.empty()) {
        const Io flushed = Flush(c);
        if (flushed == Io::kClosed) return Close(c);
        if (flushed == Io::kAgain && c.phase == Phase::kWriting) return;
      }
      if (c.phase == Phase::kWriting && !AfterReply(c)) return;  // the reply is out
      if (c.phase == Phase::kDraining) return Drain(c);
      if (c.phase != Phase::kReading) return;
      // Bytes left from the last read first, then the socket.
      std::string input = std::move(c.pending);
      c.pending.clear();
      if (input.empty()) {
        // Unread bytes stay in the socket (or in TLS's buffer, which poll does not see: read on).
        if (reads_left <= 0 && (c.ssl == nullptr || SSL_has_pending(c.ssl) == 0)) return;
        --reads_left;
        char buffer[kReadChunk];
        size_t got = 0;
        const Io read = Read(c, buffer, sizeof(buffer), &got);
        if (read == Io::kClosed) return Close(c);
        if (read == Io::kAgain) return;
        input.assign(buffer, got);
      }
      const size_t used = c.parser.Consume(input);
      c.pending = input.substr(used);
      Progress(c);
      if (c.parser.state() == RequestParser::State::kBody ||
          c.parser.state() == RequestParser::State::kDone) {
        Hold(c, c.parser.body_bytes());
        if (bodies_held_ > options_.max_bodies_held_bytes) {
          c.pending.clear();
          c.drain_after_write = true;
          Send(c,
               error_reply_(503, absl::UnavailableError(absl::StrCat(
                                     "the gateway holds ", options_.max_bodies_held_bytes >> 20,
                                     " MiB of request bodies at once; retry shortly"))),
               false);
          continue;
        }
      }
      switch (c.parser.state()) {
        case RequestParser::State::kHead:
        case RequestParser::State::kBody:
          if (c.parser.state() == RequestParser::State::kBody && c.parser.expects_continue() &&
              !c.sent_continue) {
            c.sent_continue = true;
            c.out += "HTTP/1.1 100 Continue\r\n\r\n";
          }
          continue;
        case RequestParser::State::kError:
          c.pending.clear();
          c.drain_after_write = true;
          Send(c, error_reply_(c.parser.error_status(), c.parser.error()), false);
          continue;
        case RequestParser::State::kDone:
          Dispatch(c);
          if (c.phase == Phase::kHandling) return;
          continue;
      }
    }
  }

  // Sets the deadline as the request moves from idle to head to body.
  void Progress(Connection& c) {
    const absl::Time now = absl::Now();
    if (c.idle && c.parser.started()) {
      c.idle = false;
      c.deadline = now + options_.limits.head_timeout;
    }
    if (c.seen == RequestParser::State::kHead && c.parser.state() == RequestParser::State::kBody) {
      c.seen = RequestParser::State::kBody;
      c.deadline = now + options_.limits.body_timeout;
    }
  }

  void Dispatch(Connection& c) {
    const bool keep_alive = c.parser.keep_alive();
    HttpRequest request = c.parser.Take();
    c.keep_alive = keep_alive;
    c.head_request = request.method == "HEAD";
    if ((request.method == "GET" || c.head_request) && request.path == options_.health_path) {
      HttpResponse ok;
      ok.body = "ok\n";
      return Send(c, ok, keep_alive);
    }
    c.phase = Phase::kHandling;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      work_.emplace_back(c.id, std::move(request));
    }
    work_ready_.notify_one();
  }

  const HttpServerOptions options_;
  const HttpHandler handler_;
  const HttpErrorReply error_reply_;
  SSL_CTX* tls_ = nullptr;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_ = false;
  std::thread io_thread_;
  std::vector<std::thread> handler_threads_;

  // The I/O thread's own.
  std::map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::map<std::string, size_t> per_address_;
  uint64_t last_id_ = 0;
  size_t bodies_held_ = 0;
  absl::Time accept_paused_until_ = absl::InfinitePast();

  // Between the I/O thread and the handlers.
  std::mutex mutex_;
  std::condition_variable work_ready_;
  bool handlers_stopping_ = false;
  std::deque<std::pair<uint64_t, HttpRequest>> work_;
  std::deque<std::pair<uint64_t, HttpResponse>> done_;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;
int HttpServer::port() const { return impl_->port(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpHandler handler,
                                                              HttpErrorReply error_reply) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("the REST gateway's TLS needs both --tls_cert and --tls_key");
  }
  auto impl =
      std::make_unique<Impl>(std::move(options), std::move(handler), std::move(error_reply));
  if (absl::Status opened = impl->Open(); !opened.ok()) return opened;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace rlhfd::controller

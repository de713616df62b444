// HttpServer: a small HTTP/1.1 server whose every resource is bounded before any handler runs,
// so that clients without a token cannot exhaust it. One I/O thread accepts, reads request heads
// and bodies non-blocking under byte, line and time limits, answers the health path itself, and
// hands complete requests to a small handler pool; replies carry a Content-Length. It knows
// nothing of the controller: the gateway (http_gateway.h) routes and formats what it hands over.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/gateway/http_request.h"

namespace rlhfd::controller {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                             // 0: any free port
  std::string tls_cert_file, tls_key_file;  // both (TLS only) or neither
  HttpLimits limits;
  // Open connections, in all and per client address. A new connection over either cap takes the
  // place of the one (of that address, or any) that has waited longest for a request head; when
  // every one is busy with a request, the newcomer gets 503.
  size_t max_connections = 256;
  size_t max_connections_per_address = 32;
  // Request bodies held at once (received, or waiting for their reply), in all: a request whose
  // body would take more gets 503, so that many clients sending bodies slowly cannot hold
  // max_connections times the body limit.
  size_t max_bodies_held_bytes = 64 << 20;
  int handler_threads = 8;
  // GET of this path is answered "ok" by the I/O thread itself: never queued behind handlers.
  std::string health_path = "/healthz";
};

// Routes a request; runs on a handler thread; must not throw.
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
// The reply to a request the server refuses itself (`http_status` 400, 408, 413, 431, 501, 503),
// `why` saying what to change; the gateway renders its JSON error here.
using HttpErrorReply = std::function<HttpResponse(int http_status, const absl::Status& why)>;

class HttpServer {
 public:
  // Binds, then serves on threads of its own until destroyed.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpHandler handler,
                                                           HttpErrorReply error_reply);
  // Stops accepting, lets running handlers finish, closes every connection.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;

 private:
  class Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlhfd::controller

// One connection of HttpServer (http_server.h) and its bytes on the wire: the listening socket,
// the TLS context, the handshake, non-blocking reads and writes over plain TCP or TLS, and a
// reply's serialization. Internal to the server: what a connection may hold and for how long is
// the server's (limits, deadlines, caps).
#pragma once

#include <openssl/ssl.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/gateway/http_request.h"

namespace rlhfd::controller {

// Where a connection is: TLS handshake, reading a request, its request with a handler, writing
// the reply, or reading and discarding what a refused client still sends.
enum class ConnectionPhase { kHandshake, kReading, kHandling, kWriting, kDraining };

// A client's connection; the server's I/O thread owns it.
struct HttpConnection {
  explicit HttpConnection(const HttpLimits& limits) : parser(limits) {}
  uint64_t id = 0;
  int fd = -1;
  SSL* ssl = nullptr;
  std::string address;
  ConnectionPhase phase = ConnectionPhase::kReading;
  RequestParser parser;
  RequestParser::State seen = RequestParser::State::kHead;  // for the deadline's kind
  bool idle = false;    // waiting for a keep-alive request's first byte
  std::string pending;  // read past the request being handled
  std::string out;
  size_t out_sent = 0;
  bool sent_continue = false;
  bool keep_alive = true;
  bool head_request = false;  // the request being answered is a HEAD: its reply has no body
  bool drain_after_write = false;
  size_t drained = 0;
  size_t body_held = 0;  // of bodies_held_
  bool ssl_wants_write = false, ssl_wants_read = false;
  absl::Time deadline;
  absl::Time waiting_since;  // eviction order: longest waiting for a request goes first
};

// What a non-blocking step on the wire came to.
enum class Io { kDone, kAgain, kClosed };

// A listening socket (non-blocking) on host:port; the port it got in `bound_port` (port 0: any).
absl::StatusOr<int> ListenOn(const std::string& host, int port, int* bound_port);
// A TLS 1.2+ server context of the PEM certificate chain and key.
absl::StatusOr<SSL_CTX*> MakeServerTls(const std::string& cert_file, const std::string& key_file);

// The TLS handshake, as far as it goes without blocking.
Io Handshake(HttpConnection& c);
// Reads up to `size` bytes into `buffer` (`got` of them).
Io Read(HttpConnection& c, char* buffer, size_t size, size_t* got);
// Writes what is left of c.out.
Io Flush(HttpConnection& c);
// Shuts TLS down (best effort) and closes the socket.
void CloseSocket(HttpConnection& c);

// The status line, Content-Type, Content-Length, the headers and the body (none for a HEAD
// request, whose Content-Length is still the body's, RFC 9110 9.3.2).
std::string Serialize(const HttpResponse& response, bool keep_alive, bool head_request);

}  // namespace rlhfd::controller

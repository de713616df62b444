#include "controller/gateway/http_connection.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace rlhfd::controller {
namespace {

const char* Reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status";
  }
}

}  // namespace

std::string Serialize(const HttpResponse& response, bool keep_alive, bool head_request) {
  std::string out = absl::StrCat("HTTP/1.1 ", response.status, " ", Reason(response.status),
                                 "\r\nContent-Type: ", response.content_type,
                                 "\r\nContent-Length: ", response.body.size(), "\r\n");
  for (const auto& [name, value] : response.headers) {
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  }
  absl::StrAppend(&out,
                  keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
  if (!head_request) out += response.body;
  return out;
}

absl::StatusOr<int> ListenOn(const std::string& host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen: cannot resolve host '", host, "'"));
  }
  int listen_fd = -1;
  int error = 0;
  for (addrinfo* at = found; at != nullptr && listen_fd < 0; at = at->ai_next) {
    const int fd = socket(at->ai_family, at->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, at->ai_addr, at->ai_addrlen) == 0 && listen(fd, 512) == 0) {
      listen_fd = fd;
    } else {
      error = errno;
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd < 0) {
    return absl::UnavailableError(absl::StrCat("the REST gateway cannot listen on ", host, ":",
                                               port, " (", std::strerror(error),
                                               "); free the port or choose another --http_listen"));
  }
  sockaddr_storage bound{};
  socklen_t size = sizeof(bound);
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &size);
  *bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return listen_fd;
}

absl::StatusOr<SSL_CTX*> MakeServerTls(const std::string& cert_file, const std::string& key_file) {
  SSL_CTX* tls = SSL_CTX_new(TLS_server_method());
  if (tls == nullptr) return absl::InternalError("OpenSSL cannot create a TLS context");
  SSL_CTX_set_min_proto_version(tls, TLS1_2_VERSION);
  SSL_CTX_set_mode(tls, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(tls, cert_file.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(tls, key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(tls) != 1) {
    char reason[256] = "";
    ERR_error_string_n(ERR_get_error(), reason, sizeof(reason));
    ERR_clear_error();
    SSL_CTX_free(tls);
    return absl::InvalidArgumentError(
        absl::StrCat("the REST gateway cannot use --tls_cert ", cert_file, " and --tls_key ",
                     key_file, " (", reason, "): give a PEM certificate and its key"));
  }
  return tls;
}

Io Handshake(HttpConnection& c) {
  ERR_clear_error();
  const int result = SSL_accept(c.ssl);
  if (result == 1) return Io::kDone;
  const int error = SSL_get_error(c.ssl, result);
  c.ssl_wants_write = error == SSL_ERROR_WANT_WRITE;
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return Io::kAgain;
  ERR_clear_error();
  return Io::kClosed;  // plaintext on the TLS port, an untrusting client, ...
}

Io Read(HttpConnection& c, char* buffer, size_t size, size_t* got) {
  if (c.ssl == nullptr) {
    const ssize_t n = recv(c.fd, buffer, size, 0);
    if (n > 0) {
      *got = n;
      return Io::kDone;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Io::kAgain;
    return Io::kClosed;
  }
  ERR_clear_error();
  const int n = SSL_read(c.ssl, buffer, static_cast<int>(size));
  c.ssl_wants_write = false;
  if (n > 0) {
    *got = n;
    return Io::kDone;
  }
  const int error = SSL_get_error(c.ssl, n);
  if (error == SSL_ERROR_WANT_READ) return Io::kAgain;
  if (error == SSL_ERROR_WANT_WRITE) {
    c.ssl_wants_write = true;
    return Io::kAgain;
  }
  ERR_clear_error();
  return Io::kClosed;
}

Io Flush(HttpConnection& c) {
  while (c.out_sent < c.out.size()) {
    const char* data = c.out.data() + c.out_sent;
    const size_t size = c.out.size() - c.out_sent;
    if (c.ssl == nullptr) {
      const ssize_t n = send(c.fd, data, size, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Io::kAgain;
        return Io::kClosed;
      }
      c.out_sent += n;
      continue;
    }
    ERR_clear_error();
    const int n = SSL_write(c.ssl, data, static_cast<int>(std::min<size_t>(size, 1 << 30)));
    c.ssl_wants_read = false;
    if (n > 0) {
      c.out_sent += n;
      continue;
    }
    const int error = SSL_get_error(c.ssl, n);
    if (error == SSL_ERROR_WANT_WRITE) return Io::kAgain;
    if (error == SSL_ERROR_WANT_READ) {
      c.ssl_wants_read = true;
      return Io::kAgain;
    }
    ERR_clear_error();
    return Io::kClosed;
  }
  c.out.clear();
  c.out_sent = 0;
  return Io::kDone;
}

void CloseSocket(HttpConnection& c) {
  if (c.ssl != nullptr) {
    if (SSL_is_init_finished(c.ssl)) SSL_shutdown(c.ssl);  // best effort, non-blocking
    SSL_free(c.ssl);
    c.ssl = nullptr;
    ERR_clear_error();
  }
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
}

}  // namespace rlhfd::controller

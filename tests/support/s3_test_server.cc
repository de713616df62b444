#include "tests/support/s3_test_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace rlhfd::testing {
namespace {

bool Accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool connected =
      ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return connected;
}

}  // namespace

S3TestServer::S3TestServer(const std::string& log_dir) {
  const int port = FreeLoopbackPort();
  endpoint_ = absl::StrCat("http://127.0.0.1:", port);
  process_ = std::make_unique<Subprocess>(
      std::vector<std::string>{RLHFD_PYTHON_BIN, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               absl::StrCat(port)},
      log_dir + "/moto.log");
  if (!WaitFor([&] { return Accepts(port) || !process_->running(); }, absl::Seconds(60)) ||
      !process_->running()) {
    error_ = absl::StrCat(
        "moto's S3 server (", RLHFD_PYTHON_BIN,
        " -m moto.server) did not start; run deploy/setup.sh. Its log: ", process_->ReadLog());
  }
}

void SetS3Environment(const std::string& endpoint) {
  ::setenv("AWS_ACCESS_KEY_ID", "rlhfd-test", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "rlhfd-test-secret", 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  ::setenv("AWS_ENDPOINT_URL", endpoint.c_str(), 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  ::unsetenv("AWS_ENDPOINT_URL_S3");
}

}  // namespace rlhfd::testing

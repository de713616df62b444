// An S3-compatible server for tests: moto's server mode (PyPI moto[server], which
// deploy/setup.sh installs into the venv) on a loopback port, killed with the test.
#pragma once

#include <memory>
#include <string>

#include "tests/support/subprocess.h"

namespace rlhfd::testing {

class S3TestServer {
 public:
  // Starts the server and waits until it answers; `error()` says why when it did not.
  explicit S3TestServer(const std::string& log_dir);
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  // "http://127.0.0.1:<port>": AWS_ENDPOINT_URL for the code under test.
  const std::string& endpoint() const { return endpoint_; }
  Subprocess& process() { return *process_; }

 private:
  std::string endpoint_;
  std::string error_;
  std::unique_ptr<Subprocess> process_;
};

// Sets the AWS_* variables a client reads (test credentials, us-east-1, the endpoint) in this
// process's environment, so the programs it starts inherit them.
void SetS3Environment(const std::string& endpoint);

}  // namespace rlhfd::testing

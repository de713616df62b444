// HttpGateway: the REST face of the controller (--http_listen). Each route calls the same
// Controller method its gRPC twin does, on the controller's event loop, and answers with
// protobuf's JSON mapping of the gRPC reply; errors are {"code", "message"} with the matching
// HTTP status. The same token as gRPC on every route but /healthz: "Authorization: Bearer
// <token>", or HTTP Basic with the token as the password (a browser's way); TLS with the
// controller's --tls_cert/--tls_key.
//   GET  /                             the dashboard (dashboard.h) and /static/chart.js
//   GET  /healthz                      "ok" (no token)
//   GET  /v1/openapi.json              this API as an OpenAPI 3 document
//   GET  /metrics                      Prometheus text exposition
//   GET  /v1/cluster                   GetCluster
//   GET  /v1/workers                   ListWorkers
//   GET  /v1/jobs[?state=running,...&page_size=N&page_token=T]  ListJobs, a page at a time
//   GET  /v1/jobs/{id}                 GetJob
//   GET  /v1/jobs/{id}/metrics[?since=STEP]   GetJobMetrics (steps after STEP)
//   POST /v1/jobs[?name=FILE&override=k=v...] SubmitJob; the body is the YAML or JSON config
//   POST /v1/jobs/{id}:cancel          CancelJob
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/util/event_loop.h"
#include "controller/controller.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace rlhfd::controller {

struct GatewayOptions {
  std::string listen = "127.0.0.1:0";  // host:port
  std::string token;
  std::string tls_cert_file, tls_key_file;  // both or neither
  absl::Duration call_deadline = absl::Seconds(10);  // waiting for the event loop
};

class HttpGateway {
 public:
  // Binds and serves on a thread of its own. `controller` and `loop` outlive the gateway.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(Controller* controller, EventLoop* loop,
                                                            GatewayOptions options);
  // Stops serving and joins the thread.
  ~HttpGateway();
  HttpGateway(const HttpGateway&) = delete;
  HttpGateway& operator=(const HttpGateway&) = delete;

  int port() const { return port_; }

 private:
  HttpGateway(Controller* controller, EventLoop* loop, GatewayOptions options);
  void Routes();

  Controller* controller_;
  EventLoop* loop_;
  GatewayOptions options_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
};

// The Prometheus text exposition of the controller's state: jobs and workers by state, and per
// running job its step, total steps, seconds per step, restarts and last mean reward and
// throughput. Runs on the loop.
std::string PrometheusText(Controller& controller);

}  // namespace rlhfd::controller

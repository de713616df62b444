// HttpGateway: the REST face of the controller (--http_listen). Each route calls the same
// Controller method its gRPC twin does, on the controller's event loop, and answers with
// protobuf's JSON mapping of the gRPC reply; errors are {"code", "message"} with the matching
// HTTP status. The same tokens as gRPC on every route but /healthz: "Authorization: Bearer
// <token>", or HTTP Basic with the token as the password (a browser's way); GET routes take the
// read-only token too, POST routes only the admin token; TLS with the
// controller's --tls_cert/--tls_key. The transport, and every limit a client meets before its
// token is checked, is HttpServer's (http_server.h).
//   GET  /                             the dashboard (dashboard.h) and /static/chart.js
//   GET  /healthz                      "ok" (no token)
//   GET  /v1/openapi.json              this API as an OpenAPI 3 document
//   GET  /metrics                      Prometheus text exposition
//   GET  /v1/cluster                   GetCluster
//   GET  /v1/workers                   ListWorkers
//   GET  /v1/jobs[?state=running,...&page_size=N&page_token=T]  ListJobs, a page at a time
//   GET  /v1/jobs/{id}                 GetJob
//   GET  /v1/jobs/{id}/metrics[?since=STEP]   GetJobMetrics (steps after STEP)
//   GET  /v1/jobs/{id}/samples[?since=STEP]   GetJobSamples (steps after STEP)
//   POST /v1/jobs[?name=FILE&override=k=v...] SubmitJob; the body is the YAML or JSON config
//   POST /v1/jobs/{id}:cancel          CancelJob
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/auth.h"
#include "common/util/event_loop.h"
#include "controller/controller.h"
#include "controller/gateway/http_server.h"
#include "controller/metrics/call_metrics.h"

namespace rlhfd::controller {

struct GatewayOptions {
  std::string listen = "127.0.0.1:0";  // host:port
  ClientTokens tokens;
  std::string tls_cert_file, tls_key_file;           // both or neither
  absl::Duration call_deadline = absl::Seconds(10);  // waiting for the event loop
};

class HttpGateway {
 public:
  // Binds and serves on threads of its own. `controller`, `loop` and `call_metrics` (what each
  // route records, and /metrics shows) outlive the gateway.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(Controller* controller, EventLoop* loop,
                                                            CallMetrics* call_metrics,
                                                            GatewayOptions options);
  // Stops serving and joins its threads.
  ~HttpGateway();
  HttpGateway(const HttpGateway&) = delete;
  HttpGateway& operator=(const HttpGateway&) = delete;

  int port() const { return server_->port(); }

 private:
  // A route's handler; `ids` holds what the pattern's {placeholders} matched, in order.
  using Handler = std::function<void(const HttpRequest& request,
                                     const std::vector<std::string>& ids, HttpResponse& response)>;
  struct Route {
    std::string method;
    std::string pattern;  // "/v1/jobs/{id}:cancel": a {placeholder} is one or more of [^/:]
    Handler handler;
  };

  HttpGateway(Controller* controller, EventLoop* loop, CallMetrics* call_metrics,
              GatewayOptions options);
  // The routes: the pages (dashboard, OpenAPI, /metrics), the cluster's and the jobs'.
  void Routes();
  void PageRoutes();
  void ClusterRoutes();
  void JobRoutes();
  // Runs `call` (returning StatusOr<Reply>) on the event loop and waits for it at most the
  // call deadline; a call the loop gets to later still runs, into a promise nobody reads.
  template <typename Call>
  auto OnLoop(Call call) const -> decltype(call());
  // Calls `begin(done)`, an asynchronous Controller method, and waits for `done` at most the
  // call deadline.
  template <typename Reply, typename Begin>
  absl::StatusOr<Reply> Await(Begin begin) const;
  // Token-checked routes, named "METHOD pattern" in the call metrics.
  void Get(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, Handler handler);
  void Add(const std::string& method, const std::string& pattern, Handler handler);
  HttpResponse Handle(const HttpRequest& request) const;

  Controller* controller_;
  EventLoop* loop_;
  CallMetrics* call_metrics_;
  GatewayOptions options_;
  std::vector<Route> routes_;
  std::unique_ptr<HttpServer> server_;  // last: its handler threads use the members above
};

// The Prometheus text exposition of the controller's state: jobs and workers by state, and per
// running job its step, total steps, seconds per step, restarts and last mean reward and
// throughput. Runs on the loop.
std::string PrometheusText(Controller& controller);

}  // namespace rlhfd::controller

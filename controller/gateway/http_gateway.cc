#include "controller/gateway/http_gateway.h"

#include <httplib.h>

#include <cmath>
#include <functional>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "common/rpc/pending_unary.h"
#include "common/util/files.h"
#include "controller/api/call_metrics.h"
#include "controller/gateway/dashboard.h"
#include "controller/gateway/openapi.h"
#include "google/protobuf/util/json_util.h"

namespace rlhfd::controller {
namespace {

// A config is at most 1 MiB (the gRPC limit's reason); a little more for the request around it.
constexpr size_t kMaxBody = (1 << 20) + 4096;
constexpr size_t kServerThreads = 128;

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// The canonical name of a status code, as gRPC's JSON errors spell it ("INVALID_ARGUMENT").
std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  for (char& c : name) c = c == ' ' ? '_' : absl::ascii_toupper(static_cast<unsigned char>(c));
  return name;
}

void Reply(httplib::Response& response, const absl::Status& status) {
  nlohmann::json body = {{"code", CodeName(status.code())},
                         {"message", std::string(status.message())}};
  response.status = HttpStatus(status.code());
  response.set_content(body.dump(), "application/json");
}

void Reply(httplib::Response& response, const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (const auto printed = google::protobuf::util::MessageToJsonString(message, &json, options);
      !printed.ok()) {
    Reply(response, absl::InternalError(
                        absl::StrCat("encoding the reply: ", std::string(printed.message()))));
    return;
  }
  response.status = 200;
  response.set_content(json, "application/json");
}

absl::StatusOr<v1::JobState> ParseState(absl::string_view text) {
  v1::JobState state;
  const std::string name = absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(text));
  if (!v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: '", text.substr(0, 40),
        "' is not a job state (queued, placing, starting, running, recovering, succeeded, "
        "failed, cancelled)"));
  }
  return state;
}

std::string Escaped(const std::string& label) {
  std::string out;
  for (char c : label) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// A sample value as the exposition format spells it: NaN, +Inf and -Inf for the non-finite.
std::string PrometheusNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return absl::StrCat(value);
}

std::string ShortState(const google::protobuf::EnumDescriptor* type, int value,
                       absl::string_view prefix) {
  std::string name = type->FindValueByNumber(value)->name();
  if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
}

}  // namespace

std::string PrometheusText(Controller& controller) {
  std::string out;
  const auto gauge = [&](const char* name, const char* help) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n");
  };
  std::map<std::string, int> jobs_by_state, workers_by_state;
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i) {
    if (v1::JobState_IsValid(i) && i != v1::JOB_STATE_UNSPECIFIED) {
      jobs_by_state[ShortState(v1::JobState_descriptor(), i, "JOB_STATE_")] = 0;
    }
  }
  for (int i = v1::WorkerState_MIN; i <= v1::WorkerState_MAX; ++i) {
    if (v1::WorkerState_IsValid(i) && i != 0) {
      workers_by_state[ShortState(v1::WorkerState_descriptor(), i, "WORKER_STATE_")] = 0;
    }
  }
  const absl::StatusOr<v1::ListJobsReply> jobs = controller.ListJobs({});
  const absl::StatusOr<v1::ListWorkersReply> workers = controller.ListWorkers({});
  if (jobs.ok()) {
    for (const v1::Job& job : jobs->jobs()) {
      ++jobs_by_state[ShortState(v1::JobState_descriptor(), job.state(), "JOB_STATE_")];
    }
  }
  if (workers.ok()) {
    for (const v1::Worker& worker : workers->workers()) {
      ++workers_by_state[ShortState(v1::WorkerState_descriptor(), worker.state(), "WORKER_STATE_")];
    }
  }
  gauge("rlhfd_jobs", "Jobs by state.");
  for (const auto& [state, count] : jobs_by_state) {
    absl::StrAppend(&out, "rlhfd_jobs{state=\"", state, "\"} ", count, "\n");
  }
  gauge("rlhfd_workers", "Workers by state.");
  for (const auto& [state, count] : workers_by_state) {
    absl::StrAppend(&out, "rlhfd_workers{state=\"", state, "\"} ", count, "\n");
  }
  struct PerJob {
    const char* name;
    const char* help;
    std::function<std::optional<double>(const v1::Job&)> value;
  };
  const auto metric = [](const char* key) {
    return [key](const v1::Job& job) -> std::optional<double> {
      const auto& last = job.progress().last_metrics();
      const auto found = last.find(key);
      if (found == last.end()) return std::nullopt;
      return found->second;
    };
  };
  const std::vector<PerJob> per_job = {
      {"rlhfd_job_step", "The last finished RL step of a job that has not ended.",
       [](const v1::Job& job) { return static_cast<double>(job.progress().current_step()); }},
      {"rlhfd_job_total_steps", "The RL steps the job runs.",
       [](const v1::Job& job) { return static_cast<double>(job.progress().total_steps()); }},
      {"rlhfd_job_step_seconds", "Wall time of the job's last step.",
       [](const v1::Job& job) { return job.progress().step_time_s(); }},
      {"rlhfd_job_restarts", "Recoveries of the job so far.",
       [](const v1::Job& job) { return static_cast<double>(job.progress().restarts()); }},
      {"rlhfd_job_mean_reward", "critic/score/mean of the job's last step.",
       metric("critic/score/mean")},
      {"rlhfd_job_tokens_per_second", "perf/throughput of the job's last step (tokens/s/GPU).",
       metric("perf/throughput")},
  };
  for (const PerJob& series : per_job) {
    gauge(series.name, series.help);
    if (!jobs.ok()) continue;
    for (const v1::Job& job : jobs->jobs()) {
      const v1::JobState state = job.state();
      if (state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
          state == v1::JOB_STATE_CANCELLED || state == v1::JOB_STATE_QUEUED) {
        continue;
      }
      const std::optional<double> value = series.value(job);
      if (!value) continue;
      absl::StrAppend(&out, series.name, "{job=\"", job.job_id(), "\",name=\"",
                      Escaped(job.spec().name()), "\"} ", PrometheusNumber(*value), "\n");
    }
  }
  return out;
}

HttpGateway::HttpGateway(Controller* controller, EventLoop* loop, GatewayOptions options)
    : controller_(controller), loop_(loop), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(Controller* controller,
                                                                EventLoop* loop,
                                                                GatewayOptions options) {
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen: '", options.listen, "' is not host:port"));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("the REST gateway's TLS needs both --tls_cert and --tls_key");
  }
  std::unique_ptr<HttpGateway> gateway(new HttpGateway(controller, loop, std::move(options)));
  if (gateway->options_.tls_cert_file.empty()) {
    gateway->server_ = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(gateway->options_.tls_cert_file.c_str(),
                                                    gateway->options_.tls_key_file.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the REST gateway cannot use --tls_cert ", gateway->options_.tls_cert_file,
                       " and --tls_key ", gateway->options_.tls_key_file));
    }
    gateway->server_ = std::move(tls);
  }
  // A thread per connection being served: enough for a dashboard, scrapers and scripts at once
  // (httplib's default is 8). httplib owns the pool it is handed.
  gateway->server_->new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
  gateway->server_->set_keep_alive_max_count(1000);
  // Small replies go out at once rather than after the peer's delayed ACK (a 40 ms stall).
  gateway->server_->set_tcp_nodelay(true);
  gateway->server_->set_payload_max_length(kMaxBody);
  gateway->server_->set_read_timeout(10, 0);
  gateway->server_->set_write_timeout(10, 0);
  gateway->Routes();
  if (port == 0) {
    gateway->port_ = gateway->server_->bind_to_any_port(host);
  } else if (gateway->server_->bind_to_port(host, port)) {
    gateway->port_ = port;
  }
  if (gateway->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("the REST gateway cannot listen on ", gateway->options_.listen));
  }
  gateway->thread_ =
      std::thread([server = gateway->server_.get()] { server->listen_after_bind(); });
  return gateway;
}

HttpGateway::~HttpGateway() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpGateway::Routes() {
  // Runs `call` (returning StatusOr<Reply>) on the event loop and waits for it at most the
  // call deadline; a call the loop gets to later still runs, into a promise nobody reads.
  const auto on_loop = [this](auto call) {
    using Result = decltype(call());
    auto promise = std::make_shared<std::promise<Result>>();
    std::future<Result> future = promise->get_future();
    loop_->Post([promise, call = std::move(call)]() mutable {
      promise->set_value(CatchAll<typename Result::value_type>("REST", call));
    });
    if (future.wait_for(absl::ToChronoMilliseconds(options_.call_deadline)) !=
        std::future_status::ready) {
      return Result(absl::DeadlineExceededError("the controller did not answer in time"));
    }
    return future.get();
  };
  // Every route but /healthz: the token, then the handler; nothing it throws leaves it.
  const auto authorized = [this](std::string route, auto handler) {
    return [this, route, handler](const httplib::Request& request, httplib::Response& response) {
      const absl::Time arrived = absl::Now();
      const absl::Cleanup record = [&] {
        CallMetrics::Get().Record("rest/" + route, std::to_string(response.status),
                                  absl::Now() - arrived);
      };
      const std::string authorization = request.get_header_value("Authorization");
      const absl::Status allowed = CheckHttpAuthorization(
          request.has_header("Authorization") ? &authorization : nullptr, options_.token);
      if (!allowed.ok()) {
        // Scripts send the bearer token; a browser asks its user once (the token as password)
        // and sends it with every later request of the session, the dashboard's included.
        response.set_header("WWW-Authenticate", "Bearer realm=\"rlhfd\"");
        response.set_header("WWW-Authenticate", "Basic realm=\"rlhfd\", charset=\"UTF-8\"");
        Reply(response, allowed);
        return;
      }
      try {
        handler(request, response);
      } catch (const std::exception& error) {
        RLOG(ERROR) << "REST " << request.path << ": " << error.what();
        Reply(response, absl::InternalError("the controller failed this request; see its log"));
      }
    };
  };
  const auto answer = [](httplib::Response& response, const auto& result) {
    if (result.ok()) {
      Reply(response, *result);
    } else {
      Reply(response, result.status());
    }
  };
  Controller* controller = controller_;

  server_->set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    if (response.status == 404) {
      Reply(response, absl::NotFoundError(absl::StrCat(
                          "no route ", request.method, " ", request.path.substr(0, 200),
                          " (the routes: /healthz, /metrics, /v1/cluster, /v1/workers, /v1/jobs, "
                          "/v1/jobs/{id}, /v1/jobs/{id}/metrics, POST /v1/jobs/{id}:cancel)")));
      response.status = 404;
    } else if (response.status == 413) {
      Reply(response, absl::ResourceExhaustedError("the request body is over 1 MiB"));
      response.status = 413;
    }
  });
  server_->Get("/", authorized("GET /", [](const httplib::Request&, httplib::Response& response) {
                 response.set_content(DashboardPage(), "text/html; charset=utf-8");
               }));
  server_->Get(
      "/static/chart.js",
      authorized("GET /static/chart.js", [](const httplib::Request&, httplib::Response& response) {
        static const absl::StatusOr<std::string> chart = ReadFileToString(kChartJsPath, 4 << 20);
        if (!chart.ok()) {
          return Reply(response,
                       absl::NotFoundError(absl::StrCat(
                           kChartJsPath, " is missing: install Debian's libjs-chart.js")));
        }
        response.set_content(*chart, "application/javascript");
      }));
  server_->Get(
      "/v1/openapi.json",
      authorized("GET /v1/openapi.json", [](const httplib::Request&, httplib::Response& response) {
        response.status = 200;
        response.set_content(OpenApiDocument(), "application/json");
      }));
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server_->Get(
      "/metrics",
      authorized("GET /metrics", [=](const httplib::Request&, httplib::Response& response) {
        const absl::StatusOr<std::string> text = on_loop(
            [controller]() -> absl::StatusOr<std::string> { return PrometheusText(*controller); });
        if (!text.ok()) {
          Reply(response, text.status());
          return;
        }
        response.status = 200;
        response.set_content(*text + CallMetrics::Get().PrometheusText(),
                             "text/plain; version=0.0.4");
      }));
  server_->Get("/v1/cluster", authorized("GET /v1/cluster", [=](const httplib::Request&,
                                                                httplib::Response& response) {
                 answer(response, on_loop([controller] { return controller->GetCluster({}); }));
               }));
  server_->Get("/v1/workers", authorized("GET /v1/workers", [=](const httplib::Request&,
                                                                httplib::Response& response) {
                 answer(response, on_loop([controller] { return controller->ListWorkers({}); }));
               }));
  server_->Get(
      "/v1/jobs",
      authorized("GET /v1/jobs", [=](const httplib::Request& request, httplib::Response& response) {
        v1::ListJobsRequest list;
        if (request.has_param("state")) {
          for (absl::string_view item :
               absl::StrSplit(request.get_param_value("state"), ',', absl::SkipEmpty())) {
            if (list.states_size() >= 16) break;
            const absl::StatusOr<v1::JobState> state = ParseState(item);
            if (!state.ok()) return Reply(response, state.status());
            list.add_states(*state);
          }
        }
        answer(response, on_loop([controller, list] { return controller->ListJobs(list); }));
      }));
  server_->Get(R"(/v1/jobs/([^/:]+))",
               authorized("GET /v1/jobs/{id}", [=](const httplib::Request& request,
                                                   httplib::Response& response) {
                 v1::GetJobRequest get;
                 get.set_job_id(request.matches[1]);
                 answer(response, on_loop([controller, get] { return controller->GetJob(get); }));
               }));
  server_->Get(
      R"(/v1/jobs/([^/:]+)/metrics)",
      authorized("GET /v1/jobs/{id}/metrics", [=](const httplib::Request& request,
                                                  httplib::Response& response) {
        v1::GetJobMetricsRequest get;
        get.set_job_id(request.matches[1]);
        if (request.has_param("since")) {
          int64_t since = 0;
          if (!absl::SimpleAtoi(request.get_param_value("since"), &since) || since < 0) {
            return Reply(response,
                         absl::InvalidArgumentError(
                             "since: give the step after which to list (an integer >= 0)"));
          }
          get.set_after_step(since);
        }
        // The job is looked up on the loop; its history, which may be long, is read here.
        v1::GetJobRequest job;
        job.set_job_id(get.job_id());
        const absl::StatusOr<v1::GetJobReply> found =
            on_loop([controller, job] { return controller->GetJob(job); });
        if (!found.ok()) return Reply(response, found.status());
        answer(response, CatchAll<v1::GetJobMetricsReply>(
                             "GetJobMetrics", [&] { return controller->ReadJobMetrics(get); }));
      }));
  server_->Post("/v1/jobs", authorized("POST /v1/jobs", [=](const httplib::Request& request,
                                                            httplib::Response& response) {
                  v1::SubmitJobRequest submit;
                  submit.set_config_text(request.body);
                  const std::string type = request.get_header_value("Content-Type");
                  const std::string default_name =
                      absl::StrContains(type, "json") ? "rest.json" : "rest.yaml";
                  submit.set_config_name(request.has_param("name") ? request.get_param_value("name")
                                                                   : default_name);
                  for (size_t i = 0; i < request.get_param_value_count("override"); ++i) {
                    submit.add_overrides(request.get_param_value("override", i));
                  }
                  // Parsed and validated here, off the loop, as the gRPC adapter does; stored on
                  // the loop.
                  absl::StatusOr<JobManager::Submission> prepared =
                      CatchAll<JobManager::Submission>("SubmitJob",
                                                       [&] { return JobManager::Prepare(submit); });
                  if (!prepared.ok()) return Reply(response, prepared.status());
                  auto submission = std::make_shared<JobManager::Submission>(*std::move(prepared));
                  answer(response, on_loop([controller, submission] {
                           return controller->SubmitPrepared(std::move(*submission));
                         }));
                }));
  server_->Post(R"(/v1/jobs/([^/:]+):cancel)",
                authorized("POST /v1/jobs/{id}:cancel", [=](const httplib::Request& request,
                                                            httplib::Response& response) {
                  v1::CancelJobRequest cancel;
                  cancel.set_job_id(request.matches[1]);
                  answer(response,
                         on_loop([controller, cancel] { return controller->CancelJob(cancel); }));
                }));
}

}  // namespace rlhfd::controller

#include "controller/gateway/http_gateway.h"

#include <cmath>
#include <functional>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/jobs/job_states.h"
#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "common/rpc/pending_unary.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "controller/gateway/dashboard.h"
#include "controller/gateway/openapi.h"
#include "google/protobuf/util/json_util.h"

namespace rlhfd::controller {
namespace {

// The `since` parameter of the metrics and samples routes: the step after which to list (0, from
// the first, when absent).
absl::StatusOr<int64_t> SinceParam(const HttpRequest& request) {
  const std::string* text = request.Param("since");
  if (text == nullptr) return 0;
  int64_t since = 0;
  if (!absl::SimpleAtoi(*text, &since) || since < 0) {
    return absl::InvalidArgumentError("since: give the step after which to list (an integer >= 0)");
  }
  return since;
}

// A config is at most 1 MiB (the gRPC limit's reason); a little more for the request around it.
constexpr size_t kMaxBody = (1 << 20) + 4096;

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

void Reply(HttpResponse& response, const absl::Status& status) {
  // Messages quote the client's input, which need not be UTF-8; replace rather than throw.
  nlohmann::json body = {{"code", CodeName(status.code())},
                         {"message", std::string(status.message())}};
  response.status = HttpStatus(status.code());
  response.content_type = "application/json";
  response.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void Reply(HttpResponse& response, const google::protobuf::Message& message) {
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
  response.content_type = "application/json";
  response.body = std::move(json);
}

// Refuses a request a browser sent from another site's page (a form posted to this address,
// with the Basic credentials the browser holds for it), as Go's CrossOriginProtection does:
// Sec-Fetch-Site where the browser sends it, else Origin against Host. A request with neither
// comes from a script or an old browser, and the token decides.
absl::Status CheckSameOrigin(const HttpRequest& request) {
  if (const std::string* site = request.Header("Sec-Fetch-Site")) {
    if (*site == "same-origin" || *site == "none") return absl::OkStatus();
  } else if (const std::string* origin = request.Header("Origin")) {
    const std::string* host = request.Header("Host");
    const size_t scheme = origin->find("://");
    if (host != nullptr && scheme != std::string::npos &&
        absl::EqualsIgnoreCase(absl::string_view(*origin).substr(scheme + 3), *host)) {
      return absl::OkStatus();
    }
  } else {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      "a browser sent this change from another site's page (Sec-Fetch-Site or Origin is not "
      "this gateway): submit and cancel from rlhfctl, or a script with 'Authorization: Bearer'");
}

// The reply, or the error, of a StatusOr.
template <typename Result>
void Answer(HttpResponse& response, const Result& result) {
  if (result.ok()) {
    Reply(response, *result);
  } else {
    Reply(response, result.status());
  }
}

// The {placeholders} a path (as sent, %-escapes kept) fills in `pattern`, each one or more
// characters other than '/' and ':', decoded; nullopt when the path does not match. Linear,
// unlike a regex on a 32 KiB path.
std::optional<std::vector<std::string>> MatchPath(absl::string_view pattern,
                                                  absl::string_view path) {
  std::vector<std::string> ids;
  size_t at = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') {
      if (at >= path.size() || path[at] != pattern[i]) return std::nullopt;
      ++at;
      continue;
    }
    i = pattern.find('}', i);
    const size_t from = at;
    while (at < path.size() && path[at] != '/' && path[at] != ':') ++at;
    if (at == from) return std::nullopt;
    std::optional<std::string> id = UrlDecode(path.substr(from, at - from), false);
    if (!id) return std::nullopt;
    ids.push_back(*std::move(id));
  }
  if (at != path.size()) return std::nullopt;
  return ids;
}

absl::StatusOr<v1::JobState> ParseState(absl::string_view text) {
  v1::JobState state;
  const std::string name = absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(text));
  if (!v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: '", SanitizeForDisplay(text, 40),
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

void AppendGaugeHead(std::string& out, const char* name, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n");
}

// rlhfd_jobs and rlhfd_workers: every state, with its count (0 included).
void AppendStateCounts(Controller& controller, std::string& out) {
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
  // Every job counts (from the controller's counts, not a page of ListJobs).
  const absl::StatusOr<v1::GetClusterReply> cluster = controller.GetCluster({});
  const absl::StatusOr<v1::ListWorkersReply> workers = controller.ListWorkers({});
  if (cluster.ok()) {
    for (const auto& [name, count] : cluster->jobs_by_state()) {
      v1::JobState state;
      if (v1::JobState_Parse(name, &state)) {
        jobs_by_state[ShortState(v1::JobState_descriptor(), state, "JOB_STATE_")] += count;
      }
    }
  }
  if (workers.ok()) {
    for (const v1::Worker& worker : workers->workers()) {
      ++workers_by_state[ShortState(v1::WorkerState_descriptor(), worker.state(), "WORKER_STATE_")];
    }
  }
  AppendGaugeHead(out, "rlhfd_jobs", "Jobs by state.");
  for (const auto& [state, count] : jobs_by_state) {
    absl::StrAppend(&out, "rlhfd_jobs{state=\"", state, "\"} ", count, "\n");
  }
  AppendGaugeHead(out, "rlhfd_workers", "Workers by state.");
  for (const auto& [state, count] : workers_by_state) {
    absl::StrAppend(&out, "rlhfd_workers{state=\"", state, "\"} ", count, "\n");
  }
}

// A series per running job: its step, total steps, step time, restarts, reward, throughput.
void AppendJobSeries(Controller& controller, std::string& out) {
  // Only the jobs that run are read.
  const absl::StatusOr<std::vector<v1::Job>> jobs = controller.AllJobsIn(ActiveJobStates());
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
    AppendGaugeHead(out, series.name, series.help);
    if (!jobs.ok()) continue;
    for (const v1::Job& job : *jobs) {
      const v1::JobState state = job.state();
      if (IsTerminal(state) || state == v1::JOB_STATE_QUEUED) continue;
      const std::optional<double> value = series.value(job);
      if (!value) continue;
      absl::StrAppend(&out, series.name, "{job=\"", job.job_id(), "\",name=\"",
                      Escaped(job.spec().name()), "\"} ", PrometheusNumber(*value), "\n");
    }
  }
}

}  // namespace

std::string PrometheusText(Controller& controller) {
  std::string out;
  AppendStateCounts(controller, out);
  AppendJobSeries(controller, out);
  return out;
}

HttpGateway::HttpGateway(Controller* controller, EventLoop* loop, CallMetrics* call_metrics,
                         GatewayOptions options)
    : controller_(controller),
      loop_(loop),
      call_metrics_(call_metrics),
      options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(Controller* controller,
                                                                EventLoop* loop,
                                                                CallMetrics* call_metrics,
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
  std::unique_ptr<HttpGateway> gateway(
      new HttpGateway(controller, loop, call_metrics, std::move(options)));
  gateway->Routes();
  HttpServerOptions server;
  server.host = host;
  server.port = port;
  server.tls_cert_file = gateway->options_.tls_cert_file;
  server.tls_key_file = gateway->options_.tls_key_file;
  server.limits.max_body_bytes = kMaxBody;
  server.health_path = "/healthz";  // "ok", without a token, from the server's I/O thread
  absl::StatusOr<std::unique_ptr<HttpServer>> started = HttpServer::Start(
      std::move(server),
      [gateway = gateway.get()](const HttpRequest& request) { return gateway->Handle(request); },
      [](int http_status, const absl::Status& why) {
        HttpResponse response;
        Reply(response, why);
        response.status = http_status;
        return response;
      });
  if (!started.ok()) return started.status();
  gateway->server_ = *std::move(started);
  return gateway;
}

HttpGateway::~HttpGateway() { server_.reset(); }

void HttpGateway::Get(const std::string& pattern, Handler handler) {
  Add("GET", pattern, std::move(handler));
}
void HttpGateway::Post(const std::string& pattern, Handler handler) {
  Add("POST", pattern, std::move(handler));
}

// Every route but /healthz: the token (a GET reads, anything else changes), then the handler;
// nothing it throws leaves it.
void HttpGateway::Add(const std::string& method, const std::string& pattern, Handler handler) {
  const std::string name = method + " " + pattern;
  const Access access = method == "GET" ? Access::kRead : Access::kAdmin;
  Handler authorized = [this, name, access, handler = std::move(handler)](
                           const HttpRequest& request, const std::vector<std::string>& ids,
                           HttpResponse& response) {
    const absl::Time arrived = absl::Now();
    const absl::Cleanup record = [&] {
      call_metrics_->Record("rest/" + name, std::to_string(response.status), absl::Now() - arrived);
    };
    if (access == Access::kAdmin) {
      // A browser sends the Basic credentials its user gave the dashboard with any page's form
      // to this address too: a change comes only from this origin or from a non-browser client.
      if (const absl::Status same_origin = CheckSameOrigin(request); !same_origin.ok()) {
        Reply(response, same_origin);
        return;
      }
    }
    const absl::Status allowed =
        CheckHttpAccess(request.Header("Authorization"), options_.tokens, access);
    if (!allowed.ok()) {
      // Scripts send the bearer token; a browser asks its user once (the token as password)
      // and sends it with every later request of the session, the dashboard's included. The
      // read-only token on a POST is known, just not enough: 403, no new prompt.
      if (absl::IsUnauthenticated(allowed)) {
        response.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"rlhfd\"");
        response.headers.emplace_back("WWW-Authenticate",
                                      "Basic realm=\"rlhfd\", charset=\"UTF-8\"");
      }
      Reply(response, allowed);
      return;
    }
    try {
      handler(request, ids, response);
    } catch (const std::exception& error) {
      RLOG(ERROR) << "REST " << name << ": " << error.what();
      response = HttpResponse();
      Reply(response, absl::InternalError("the controller failed this request; see its log"));
    } catch (...) {
      RLOG(ERROR) << "REST " << name << ": a non-standard exception";
      response = HttpResponse();
      Reply(response, absl::InternalError("the controller failed this request; see its log"));
    }
  };
  routes_.push_back({.method = method, .pattern = pattern, .handler = std::move(authorized)});
}

HttpResponse HttpGateway::Handle(const HttpRequest& request) const {
  HttpResponse response;
  // HEAD is answered as GET; the server leaves the body off.
  const std::string method = request.method == "HEAD" ? "GET" : request.method;
  std::vector<std::string> allowed;  // the methods of the routes this path matches
  for (const Route& route : routes_) {
    const std::optional<std::vector<std::string>> ids = MatchPath(route.pattern, request.path);
    if (!ids) continue;
    if (route.method == method) {
      route.handler(request, *ids, response);
      return response;
    }
    allowed.push_back(route.method);
    if (route.method == "GET") allowed.push_back("HEAD");
  }
  if (!allowed.empty()) {
    allowed.push_back("OPTIONS");
    const std::string allow = absl::StrJoin(allowed, ", ");
    if (request.method == "OPTIONS") {
      response.status = 204;
    } else {
      Reply(response, absl::InvalidArgumentError(
                          absl::StrCat(SanitizeForDisplay(request.method, 20), " is not served at ",
                                       SanitizeForDisplay(request.path, 200), "; use ", allow)));
      response.status = 405;
    }
    response.headers.emplace_back("Allow", allow);
    return response;
  }
  Reply(response, absl::NotFoundError(absl::StrCat(
                      "no route ", request.method.substr(0, 20), " ", request.path.substr(0, 200),
                      " (the routes: /healthz, /metrics, /v1/cluster, /v1/workers, /v1/jobs, "
                      "/v1/jobs/{id}, /v1/jobs/{id}/metrics, POST /v1/jobs/{id}:cancel)")));
  return response;
}

template <typename Call>
auto HttpGateway::OnLoop(Call call) const -> decltype(call()) {
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
}

template <typename Reply, typename Begin>
absl::StatusOr<Reply> HttpGateway::Await(Begin begin) const {
  auto promise = std::make_shared<std::promise<absl::StatusOr<Reply>>>();
  std::future<absl::StatusOr<Reply>> future = promise->get_future();
  begin([promise](absl::StatusOr<Reply> reply) { promise->set_value(std::move(reply)); });
  if (future.wait_for(absl::ToChronoMilliseconds(options_.call_deadline)) !=
      std::future_status::ready) {
    return absl::DeadlineExceededError("the controller did not answer in time");
  }
  return future.get();
}

void HttpGateway::Routes() {
  PageRoutes();
  ClusterRoutes();
  JobRoutes();
}

void HttpGateway::PageRoutes() {
  using Ids = std::vector<std::string>;
  Controller* controller = controller_;
  CallMetrics* call_metrics = call_metrics_;
  Get("/", [](const HttpRequest&, const Ids&, HttpResponse& response) {
    response.content_type = "text/html; charset=utf-8";
    response.body = DashboardPage();
  });
  Get("/static/chart.js", [](const HttpRequest&, const Ids&, HttpResponse& response) {
    static const absl::StatusOr<std::string> chart = ReadFileToString(kChartJsPath, 4 << 20);
    if (!chart.ok()) {
      return Reply(response, absl::NotFoundError(absl::StrCat(
                                 kChartJsPath, " is missing: install Debian's libjs-chart.js")));
    }
    response.content_type = "application/javascript";
    response.body = *chart;
  });
  Get("/v1/openapi.json", [](const HttpRequest&, const Ids&, HttpResponse& response) {
    response.content_type = "application/json";
    response.body = OpenApiDocument();
  });
  Get("/metrics", [=, this](const HttpRequest&, const Ids&, HttpResponse& response) {
    const absl::StatusOr<std::string> text = OnLoop(
        [controller]() -> absl::StatusOr<std::string> { return PrometheusText(*controller); });
    if (!text.ok()) return Reply(response, text.status());
    response.content_type = "text/plain; version=0.0.4";
    response.body = *text + call_metrics->PrometheusText();
  });
}

void HttpGateway::ClusterRoutes() {
  using Ids = std::vector<std::string>;
  Controller* controller = controller_;
  Get("/v1/cluster", [=, this](const HttpRequest&, const Ids&, HttpResponse& response) {
    Answer(response, OnLoop([controller] { return controller->GetCluster({}); }));
  });
  Get("/v1/workers", [=, this](const HttpRequest&, const Ids&, HttpResponse& response) {
    Answer(response, OnLoop([controller] { return controller->ListWorkers({}); }));
  });
}

void HttpGateway::JobRoutes() {
  using Ids = std::vector<std::string>;
  Controller* controller = controller_;
  Get("/v1/jobs", [=, this](const HttpRequest& request, const Ids&, HttpResponse& response) {
    v1::ListJobsRequest list;
    if (const std::string* states = request.Param("state")) {
      for (absl::string_view item : absl::StrSplit(*states, ',', absl::SkipEmpty())) {
        if (list.states_size() >= 16) break;
        const absl::StatusOr<v1::JobState> state = ParseState(item);
        if (!state.ok()) return Reply(response, state.status());
        list.add_states(*state);
      }
    }
    if (const std::string* text = request.Param("page_size")) {
      int32_t page_size = 0;
      if (!absl::SimpleAtoi(*text, &page_size)) {
        return Reply(response, absl::InvalidArgumentError(
                                   "page_size: give the most jobs a page holds (an integer, 0 for "
                                   "the default)"));
      }
      list.set_page_size(page_size);
    }
    if (const std::string* token = request.Param("page_token")) list.set_page_token(*token);
    Answer(response, OnLoop([controller, list] { return controller->ListJobs(list); }));
  });
  Get("/v1/jobs/{id}", [=, this](const HttpRequest&, const Ids& ids, HttpResponse& response) {
    v1::GetJobRequest get;
    get.set_job_id(ids[0]);
    Answer(response, OnLoop([controller, get] { return controller->GetJob(get); }));
  });
  Get("/v1/jobs/{id}/metrics", [=, this](const HttpRequest& request, const Ids& ids,
                                         HttpResponse& response) {
    v1::GetJobMetricsRequest get;
    get.set_job_id(ids[0]);
    absl::StatusOr<int64_t> since = SinceParam(request);
    if (!since.ok()) return Reply(response, since.status());
    get.set_after_step(*since);
    // The Controller decides what of it runs on the loop, as for the gRPC adapter.
    Answer(response, Await<v1::GetJobMetricsReply>([&](auto done) {
             controller->GetJobMetricsAsync(*loop_, get, std::move(done));
           }));
  });
  Get("/v1/jobs/{id}/samples", [=, this](const HttpRequest& request, const Ids& ids,
                                         HttpResponse& response) {
    v1::GetJobSamplesRequest get;
    get.set_job_id(ids[0]);
    absl::StatusOr<int64_t> since = SinceParam(request);
    if (!since.ok()) return Reply(response, since.status());
    get.set_after_step(*since);
    Answer(response, Await<v1::GetJobSamplesReply>([&](auto done) {
             controller->GetJobSamplesAsync(*loop_, get, std::move(done));
           }));
  });
  Post("/v1/jobs", [=, this](const HttpRequest& request, const Ids&, HttpResponse& response) {
    v1::SubmitJobRequest submit;
    submit.set_config_text(request.body);
    const std::string* type = request.Header("Content-Type");
    const std::string* name = request.Param("name");
    submit.set_config_name(name != nullptr                                       ? *name
                           : type != nullptr && absl::StrContains(*type, "json") ? "rest.json"
                                                                                 : "rest.yaml");
    for (const std::string& item : request.Params("override")) submit.add_overrides(item);
    // The Controller decides what of it runs on the loop, as for the gRPC adapter.
    absl::StatusOr<v1::SubmitJobReply> submitted = Await<v1::SubmitJobReply>(
        [&](auto done) { controller->SubmitJobAsync(*loop_, submit, std::move(done)); });
    if (absl::IsDeadlineExceeded(submitted.status())) {
      // The submission waits on the loop and is still made: a blind retry would add a twin.
      submitted = absl::DeadlineExceededError(
          "the controller did not answer in time, and may still take the job: list the jobs "
          "(GET /v1/jobs) before submitting it again");
    }
    Answer(response, submitted);
  });
  Post("/v1/jobs/{id}:cancel",
       [=, this](const HttpRequest&, const Ids& ids, HttpResponse& response) {
         v1::CancelJobRequest cancel;
         cancel.set_job_id(ids[0]);
         Answer(response, OnLoop([controller, cancel] { return controller->CancelJob(cancel); }));
       });
}

}  // namespace rlhfd::controller

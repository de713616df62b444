// The REST gateway of a real rlhfd-controller (--http_listen), through a real HTTP client: every
// route equals its gRPC twin on the same controller; nothing but /healthz answers without the
// token; bad requests get {"code", "message"} with the matching HTTP status; /metrics parses
// with prometheus_client's own parser and counts what the controller holds.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/client_context.h>
#include <httplib.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/files.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/controller_client.h"

namespace rlhfd::testing {
namespace {

using nlohmann::json;

const std::string kSource = RLHFD_SOURCE_DIR;

std::string DemoConfig() {
  std::ifstream in(kSource + "/configs/tiny-cpu-demo.yaml");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// An override as a query parameter, percent-encoded as a URL's query needs.
std::string Override(const std::string& item) {
  std::string out = "override=";
  for (unsigned char c : item) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// The overrides that make the demo's relative paths absolute (REST has no working directory),
// and put checkpoints in this process's own directory (the config's shared default would let
// tests running side by side resume from each other's steps).
std::string AbsolutePaths() {
  static const TempDir checkpoints;
  return Override("model.path=" + kSource + "/tests/fixtures/models/tiny-qwen2") + "&" +
         Override("data.train_files=[" + kSource + "/tests/fixtures/data/arithmetic_train.jsonl]") +
         "&" + Override("trainer.checkpoint_dir=" + checkpoints.path());
}

json ToJson(const google::protobuf::Message& message) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &text, options);
  return json::parse(text);
}

class Gateway {
 public:
  // `tls_dir`: serve TLS with its cert.pem and key.pem (gRPC and REST alike).
  explicit Gateway(const std::string& tls_dir = "")
      : cluster_({RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN}, absl::Milliseconds(500),
                 absl::Seconds(3)) {
    std::vector<std::string> flags = {"--http_listen=127.0.0.1:0",
                                      "--http_port_file=" + cluster_.state_dir() + "/http.port"};
    if (!tls_dir.empty()) {
      flags.push_back("--tls_cert=" + tls_dir + "/cert.pem");
      flags.push_back("--tls_key=" + tls_dir + "/key.pem");
    }
    cluster_.SetExtraFlags(flags, {});
    std::string error;
    INFO(error);
    REQUIRE(cluster_.StartController(&error));
    REQUIRE(WaitFor([&] { return PathExists(cluster_.state_dir() + "/http.port"); },
                    absl::Seconds(10)));
    auto port = ReadFileToString(cluster_.state_dir() + "/http.port", 64);
    REQUIRE(port.ok());
    port_ = std::stoi(*port);
    if (tls_dir.empty()) {  // a TLS test makes its own client
      http_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
      http_->set_read_timeout(20, 0);
    }
    auto client = ConnectToController(cluster_);
    INFO(client.status());
    REQUIRE(client.ok());
    client_ = std::move(*client);
  }

  httplib::Headers Auth(const std::string& token) const {
    return {{"Authorization", "Bearer " + token}};
  }
  httplib::Result Get(const std::string& path) {
    return http_->Get(path.c_str(), Auth(client_.token));
  }
  httplib::Result Post(const std::string& path, const std::string& body,
                       const char* type = "application/yaml") {
    return http_->Post(path.c_str(), Auth(client_.token), body, type);
  }
  httplib::Client& http() { return *http_; }
  const std::string& token() const { return client_.token; }
  int port() const { return port_; }
  LocalCluster& cluster() { return cluster_; }

  template <typename Reply, typename Call>
  Reply Grpc(Call call) {
    grpc::ClientContext context;
    client_.Authorize(&context);
    Reply reply;
    const grpc::Status status = call(&context, &reply);
    INFO(status.error_message());
    REQUIRE(status.ok());
    return reply;
  }
  v1::JobService::Stub& jobs() { return *client_.jobs; }
  v1::ClusterService::Stub& registry() { return *client_.cluster; }

 private:
  LocalCluster cluster_;
  std::unique_ptr<httplib::Client> http_;
  int port_ = 0;
  ControllerClient client_;
};

// Two workers, and the demo job of 4 steps submitted over REST and run to SUCCEEDED; its id.
std::string RunFourSteps(Gateway& gateway) {
  for (int i = 0; i < 2; ++i) gateway.cluster().StartWorker();
  auto submitted =
      gateway.Post("/v1/jobs?" + AbsolutePaths() + "&" + Override("trainer.total_steps=4") + "&" +
                       Override("trainer.save_every=-1"),
                   DemoConfig());
  REQUIRE(submitted);
  INFO(submitted->body);
  REQUIRE(submitted->status == 200);
  const std::string id = json::parse(submitted->body)["job"]["job_id"];
  int workers_on_job = 0;  // of the two, while it ran
  REQUIRE(WaitFor(
      [&] {
        auto job = gateway.Get("/v1/jobs/" + id);
        if (!job) return false;
        const json state = json::parse(job->body)["job"]["state"];
        if (state == "JOB_STATE_RUNNING" && workers_on_job < 2) {
          auto reply = gateway.Get("/v1/workers");
          REQUIRE(reply);
          const json workers = json::parse(reply->body);
          workers_on_job = 0;
          for (const json& worker : workers["workers"]) {
            workers_on_job += worker.value("job_id", "") == id ? 1 : 0;
          }
        }
        return state == "JOB_STATE_SUCCEEDED";
      },
      absl::Seconds(300)));  // about 10 s on an idle machine; a loaded one may take much longer
  // The workers' job column (GET /v1/workers, the dashboard's) named the job while it ran.
  CHECK(workers_on_job == 2);
  return id;
}

void CheckError(const httplib::Result& result, int status, const std::string& code,
                const std::string& words) {
  REQUIRE(result);
  INFO(result->body);
  CHECK(result->status == status);
  const json body = json::parse(result->body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body["code"] == code);
  CHECK_THAT(body["message"].get<std::string>(), Catch::Contains(words));
}

TEST_CASE("No route answers without the token but /healthz", "[gateway]") {
  Gateway gateway;
  auto health = gateway.http().Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(health->body == "ok\n");
  const auto basic = [](const std::string& credentials) {
    return httplib::Headers{{"Authorization", "Basic " + absl::Base64Escape(credentials)}};
  };
  for (const char* path :
       {"/", "/static/chart.js", "/v1/openapi.json", "/metrics", "/v1/cluster", "/v1/workers",
        "/v1/jobs", "/v1/jobs/job-1", "/v1/jobs/job-1/metrics", "/v1/jobs/job-1/samples"}) {
    INFO(path);
    const httplib::Result missing = gateway.http().Get(path);
    CheckError(missing, 401, "UNAUTHENTICATED", "missing bearer token");
    // A browser is asked for the token as an HTTP Basic password.
    CHECK(missing->get_header_value_count("WWW-Authenticate") == 2);
    CHECK(absl::StartsWith(missing->get_header_value("WWW-Authenticate", 1), "Basic realm="));
    CheckError(gateway.http().Get(path, gateway.Auth("wrong")), 401, "UNAUTHENTICATED",
               "wrong bearer token");
    CheckError(gateway.http().Get(path, basic("rlhfd:wrong")), 401, "UNAUTHENTICATED",
               "wrong token");
    CheckError(gateway.http().Get(path, basic(gateway.token())), 401, "UNAUTHENTICATED",
               "wrong token");
    CheckError(gateway.http().Get(path, {{"Authorization", "Basic %%%"}}), 401, "UNAUTHENTICATED",
               "not base64");
  }
  // The token as the Basic password, with any user name, is the token.
  for (const std::string user : {"", "rlhfd", "anyone"}) {
    auto page = gateway.http().Get("/", basic(user + ":" + gateway.token()));
    REQUIRE(page);
    CHECK(page->status == 200);
    CHECK(absl::StrContains(page->body, "<title>rlhfd</title>"));
  }
  CheckError(gateway.http().Post("/v1/jobs", DemoConfig(), "application/yaml"), 401,
             "UNAUTHENTICATED", "missing bearer token");
  CheckError(gateway.http().Post("/v1/jobs/job-1:cancel", "", "text/plain"), 401, "UNAUTHENTICATED",
             "missing bearer token");
}

TEST_CASE(
    "HEAD is GET without its body, a wrong method gets 405 with Allow, a change a browser "
    "sends from another site is refused, and an escaped '/' stays in its id",
    "[gateway]") {
  Gateway gateway;
  // HEAD: the GET's status and Content-Length, no body (so the next reply on the connection
  // is not read as this one's body).
  for (const std::string path : {"/healthz", "/v1/cluster"}) {
    INFO(path);
    const httplib::Result got = gateway.Get(path);
    const httplib::Result head = gateway.http().Head(path, gateway.Auth(gateway.token()));
    REQUIRE(got);
    REQUIRE(head);
    CHECK(head->status == 200);
    CHECK(head->body.empty());
    CHECK(head->get_header_value("Content-Length") == std::to_string(got->body.size()));
  }
  const httplib::Result after = gateway.Get("/v1/workers");  // the same kept-alive connection
  REQUIRE(after);
  CHECK(after->status == 200);
  const httplib::Result deleted =
      gateway.http().Delete("/v1/jobs/job-1", gateway.Auth(gateway.token()));
  CheckError(deleted, 405, "INVALID_ARGUMENT", "DELETE is not served at /v1/jobs/job-1");
  CHECK(deleted->get_header_value("Allow") == "GET, HEAD, OPTIONS");
  const httplib::Result options = gateway.http().Options("/v1/jobs", gateway.Auth(gateway.token()));
  REQUIRE(options);
  CHECK(options->status == 204);
  CHECK(options->get_header_value("Allow") == "GET, HEAD, POST, OPTIONS");
  // The scheme's name in any case (RFC 9110).
  const httplib::Result lower =
      gateway.http().Get("/v1/cluster", {{"Authorization", "bearer " + gateway.token()}});
  REQUIRE(lower);
  CHECK(lower->status == 200);
  // A form on another site's page, posted with the credentials the browser holds for the
  // dashboard, is refused before the token is looked at; the same origin's, and a script's
  // (neither header), reach the route (here: no such job).
  const std::string cancel = "/v1/jobs/job-none:cancel";
  const std::string self = absl::StrCat("http://127.0.0.1:", gateway.port());
  for (const httplib::Headers& foreign :
       {httplib::Headers{{"Origin", "http://evil.example"}}, httplib::Headers{{"Origin", "null"}},
        httplib::Headers{{"Sec-Fetch-Site", "cross-site"}, {"Origin", self}},
        httplib::Headers{{"Sec-Fetch-Site", "same-site"}}}) {
    httplib::Headers headers = gateway.Auth(gateway.token());
    headers.insert(foreign.begin(), foreign.end());
    CheckError(gateway.http().Post(cancel, headers, "", "text/plain"), 403, "PERMISSION_DENIED",
               "another site's page");
  }
  for (const httplib::Headers& own :
       {httplib::Headers{{"Origin", self}}, httplib::Headers{{"Sec-Fetch-Site", "same-origin"}},
        httplib::Headers{}}) {
    httplib::Headers headers = gateway.Auth(gateway.token());
    headers.insert(own.begin(), own.end());
    CheckError(gateway.http().Post(cancel, headers, "", "text/plain"), 404, "NOT_FOUND",
               "job-none");
  }
  // %2F is a '/' inside the id, not a path separator: no route reads job-1's metrics from it.
  const httplib::Result escaped = gateway.Get("/v1/jobs/job-1%2Fmetrics");
  REQUIRE(escaped);
  CHECK(escaped->status != 200);
  CHECK_THAT(escaped->body, Catch::Contains("job-1/metrics"));
}

TEST_CASE("The read-only token reads every route and changes nothing, over REST and gRPC",
          "[gateway][auth]") {
  Gateway gateway;
  auto reader = ConnectToController(gateway.cluster(), "read_token");
  REQUIRE(reader.ok());
  REQUIRE(reader->token != gateway.token());
  const httplib::Headers bearer = gateway.Auth(reader->token);
  const httplib::Headers basic = {
      {"Authorization", "Basic " + absl::Base64Escape("prometheus:" + reader->token)}};
  // What a scraper and a dashboard read: all there.
  for (const char* path : {"/", "/static/chart.js", "/v1/openapi.json", "/metrics", "/v1/cluster",
                           "/v1/workers", "/v1/jobs"}) {
    INFO(path);
    for (const httplib::Headers& headers : {bearer, basic}) {
      const httplib::Result read = gateway.http().Get(path, headers);
      REQUIRE(read);
      CHECK(read->status == 200);
    }
  }
  // What changes something: 403, naming the token to use, and nothing submitted or cancelled.
  const httplib::Result submitted =
      gateway.http().Post("/v1/jobs", bearer, DemoConfig(), "application/yaml");
  CheckError(submitted, 403, "PERMISSION_DENIED", "read-only token");
  CHECK(submitted->get_header_value_count("WWW-Authenticate") == 0);
  CheckError(gateway.http().Post("/v1/jobs/job-1:cancel", basic, "", "text/plain"), 403,
             "PERMISSION_DENIED", "<controller state dir>/token");
  const httplib::Result jobs = gateway.http().Get("/v1/jobs", bearer);
  REQUIRE(jobs);
  CHECK(json::parse(jobs->body).value("jobs", json::array()).empty());

  // gRPC: the same split.
  const auto authorized = [&](grpc::ClientContext& context) {
    reader->Authorize(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  };
  {
    grpc::ClientContext context;
    authorized(context);
    v1::ListJobsReply reply;
    CHECK(reader->jobs->ListJobs(&context, v1::ListJobsRequest(), &reply).ok());
  }
  {
    grpc::ClientContext context;
    authorized(context);
    v1::GetClusterReply reply;
    CHECK(reader->cluster->GetCluster(&context, v1::GetClusterRequest(), &reply).ok());
  }
  {
    grpc::ClientContext context;
    authorized(context);
    v1::SubmitJobRequest request;
    request.set_config_text(DemoConfig());
    v1::SubmitJobReply reply;
    const grpc::Status status = reader->jobs->SubmitJob(&context, request, &reply);
    CHECK(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(status.error_message(), Catch::Contains("read-only token"));
  }
  {
    grpc::ClientContext context;
    authorized(context);
    v1::DrainWorkerRequest request;
    request.set_worker_id("cpu-worker-0");
    v1::DrainWorkerReply reply;
    CHECK(reader->cluster->DrainWorker(&context, request, &reply).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  // rlhfctl with the read-only token: reads, and a cancel says which token to use.
  CHECK(gateway.cluster().CtlWithToken(reader->token, {"jobs"}).exit_code == 0);
  const CommandResult refused = gateway.cluster().CtlWithToken(reader->token, {"cancel", "job-1"});
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.err, Catch::Contains("read-only token"));
  // A worker cannot register with it (the registry takes the admin token).
  gateway.cluster().SetExtraFlags(
      {}, {"--token_file=" + gateway.cluster().state_dir() + "/read_token"});
  const size_t worker = gateway.cluster().StartWorker();
  CHECK(WaitFor(
      [&] {
        return absl::StrContains(gateway.cluster().worker(worker).ReadLog(), "read-only token");
      },
      absl::Seconds(30)));
  const auto workers = gateway.Grpc<v1::ListWorkersReply>([&](auto* context, auto* reply) {
    return gateway.registry().ListWorkers(context, v1::ListWorkersRequest(), reply);
  });
  CHECK(workers.workers_size() == 0);
}

TEST_CASE("schemathesis fuzzes every route of the OpenAPI document: no 5xx, no crash",
          "[gateway][fuzz]") {
  Gateway gateway;
  auto document = gateway.Get("/v1/openapi.json");
  REQUIRE(document);
  CHECK(document->status == 200);
  CHECK(json::parse(document->body)["openapi"] == "3.0.3");
  const std::string url = absl::StrCat("http://127.0.0.1:", gateway.port(), "/v1/openapi.json");
  const CommandResult fuzzed = RunCommand(
      {RLHFD_SCHEMATHESIS, "run", url, "--header", "Authorization: Bearer " + gateway.token(),
       "--checks", "not_a_server_error,status_code_conformance,content_type_conformance",
       "--max-examples", "40", "--seed", "1", "--workers", "1", "--request-timeout", "15"},
      absl::Seconds(280));
  INFO(fuzzed.out << fuzzed.err);
  CHECK(fuzzed.exit_code == 0);
  CHECK(gateway.cluster().controller()->running());
  auto health = gateway.http().Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
}

TEST_CASE("Every route equals its gRPC twin; errors carry code and message", "[gateway]") {
  Gateway gateway;
  // Submitted while no worker is up: the job stays queued, so both views are of one state.
  auto submitted = gateway.Post("/v1/jobs?name=demo.yaml&" + AbsolutePaths(), DemoConfig());
  REQUIRE(submitted);
  INFO(submitted->body);
  REQUIRE(submitted->status == 200);
  const std::string id = json::parse(submitted->body)["job"]["job_id"];
  CHECK(id == "job-1");

  v1::GetJobRequest get;
  get.set_job_id(id);
  const auto job = gateway.Grpc<v1::GetJobReply>(
      [&](auto* context, auto* reply) { return gateway.jobs().GetJob(context, get, reply); });
  auto rest_job = gateway.Get("/v1/jobs/" + id);
  REQUIRE(rest_job);
  CHECK(json::parse(rest_job->body) == ToJson(job));

  v1::ListJobsRequest list;
  const auto jobs = gateway.Grpc<v1::ListJobsReply>(
      [&](auto* context, auto* reply) { return gateway.jobs().ListJobs(context, list, reply); });
  CHECK(json::parse(gateway.Get("/v1/jobs")->body) == ToJson(jobs));
  CHECK(json::parse(gateway.Get("/v1/jobs?state=queued")->body) == ToJson(jobs));
  CHECK(json::parse(gateway.Get("/v1/jobs?state=running,failed")->body)["jobs"].empty());

  const auto cluster = gateway.Grpc<v1::GetClusterReply>([&](auto* context, auto* reply) {
    return gateway.registry().GetCluster(context, v1::GetClusterRequest(), reply);
  });
  CHECK(json::parse(gateway.Get("/v1/cluster")->body) == ToJson(cluster));
  const auto workers = gateway.Grpc<v1::ListWorkersReply>([&](auto* context, auto* reply) {
    return gateway.registry().ListWorkers(context, v1::ListWorkersRequest(), reply);
  });
  CHECK(json::parse(gateway.Get("/v1/workers")->body) == ToJson(workers));

  // Errors, each naming what to fix.
  CheckError(gateway.Get("/v1/jobs?state=sleeping"), 400, "INVALID_ARGUMENT", "sleeping");
  CheckError(gateway.Get("/v1/jobs/job-99"), 404, "NOT_FOUND", "job-99");
  CheckError(gateway.Get("/v1/jobs/job-01"), 404, "NOT_FOUND", "job-01");  // canonical ids only
  CheckError(gateway.Get("/v1/jobs/job-1/metrics?since=soon"), 400, "INVALID_ARGUMENT", "since");
  CheckError(gateway.Get("/v1/jobs/job-1/samples?since=-1"), 400, "INVALID_ARGUMENT", "since");
  CheckError(gateway.Get("/v1/jobs/job-99/samples"), 404, "NOT_FOUND", "job-99");
  CheckError(gateway.Get("/v1/nothing"), 404, "NOT_FOUND", "no route GET /v1/nothing");
  CheckError(gateway.Post("/v1/jobs?name=bad.yaml", "name: x\nroles: {actor: {gpu: 1}}\n"), 400,
             "INVALID_ARGUMENT", "did you mean 'gpus'");
  CheckError(gateway.Post("/v1/jobs", std::string(2 << 20, 'a')), 413, "RESOURCE_EXHAUSTED",
             "1 MiB");

  // Cancel, then the history route on the cancelled job.
  auto cancelled = gateway.Post("/v1/jobs/" + id + ":cancel", "", "text/plain");
  REQUIRE(cancelled);
  CHECK(cancelled->status == 200);
  CHECK(json::parse(cancelled->body)["job"]["state"] == "JOB_STATE_CANCELLED");
  CheckError(gateway.Post("/v1/jobs/" + id + ":cancel", "", "text/plain"), 409,
             "FAILED_PRECONDITION", "already ended");
}

TEST_CASE("A job's metrics and /metrics while and after it runs", "[gateway]") {
  Gateway gateway;
  const std::string id = RunFourSteps(gateway);

  v1::GetJobMetricsRequest request;
  request.set_job_id(id);
  const auto history = gateway.Grpc<v1::GetJobMetricsReply>([&](auto* context, auto* reply) {
    return gateway.jobs().GetJobMetrics(context, request, reply);
  });
  CHECK(history.steps_size() == 4);
  CHECK(json::parse(gateway.Get("/v1/jobs/" + id + "/metrics")->body) == ToJson(history));
  const json since = json::parse(gateway.Get("/v1/jobs/" + id + "/metrics?since=2")->body);
  REQUIRE(since["steps"].size() == 2);
  CHECK(since["steps"][0]["step"] == "3");  // int64 in protobuf's JSON mapping is a string

  // Each step's logged responses (trainer.log_samples' default: 4), REST as gRPC.
  v1::GetJobSamplesRequest samples_request;
  samples_request.set_job_id(id);
  const auto logged = gateway.Grpc<v1::GetJobSamplesReply>([&](auto* context, auto* reply) {
    return gateway.jobs().GetJobSamples(context, samples_request, reply);
  });
  REQUIRE(logged.steps_size() == 4);
  for (const v1::StepMetrics& step : logged.steps()) {
    REQUIRE(step.samples_size() == 4);
    for (int row = 0; row < 4; ++row) {
      CHECK(step.samples(row).row() == row);
      CHECK(absl::StrContains(step.samples(row).prompt(), "What is"));
    }
  }
  CHECK(json::parse(gateway.Get("/v1/jobs/" + id + "/samples")->body) == ToJson(logged));
  const json last = json::parse(gateway.Get("/v1/jobs/" + id + "/samples?since=3")->body);
  REQUIRE(last["steps"].size() == 1);
  CHECK(last["steps"][0]["step"] == "4");
  CHECK(last["steps"][0]["samples"].size() == 4);

  auto metrics = gateway.Get("/metrics");
  REQUIRE(metrics);
  REQUIRE(metrics->status == 200);
  TempDir dir;
  {
    std::ofstream out(dir.path() + "/metrics.txt");
    out << metrics->body;
  }
  const CommandResult parsed =
      RunCommand({RLHFD_PYTHON, RLHFD_PARSE_PROMETHEUS, dir.path() + "/metrics.txt"});
  INFO(metrics->body << parsed.err);
  REQUIRE(parsed.exit_code == 0);
  std::map<std::string, double> samples;
  for (const json& sample : json::parse(parsed.out)) {
    std::string key = sample[0];
    for (const auto& [label, value] : sample[1].items()) {
      absl::StrAppend(&key, ",", label, "=", value.get<std::string>());
    }
    samples[key] = sample[2];
  }
  CHECK(samples["rlhfd_jobs,state=succeeded"] == 1);
  CHECK(samples["rlhfd_jobs,state=running"] == 0);
  CHECK(samples["rlhfd_workers,state=alive"] == 2);
  // The API's own calls: counted by method and code, with latency histograms.
  CHECK(samples["rlhfd_api_calls_total,code=200,method=rest/GET /v1/jobs/{id}"] >= 1);
  CHECK(samples["rlhfd_api_calls_total,code=OK,method=grpc/GetJobMetrics"] == 1);
  CHECK(samples["rlhfd_api_call_seconds_count,method=grpc/GetJobMetrics"] == 1);
  CHECK(samples["rlhfd_api_call_seconds_bucket,le=+Inf,method=grpc/RegisterWorker"] >= 2);
}

TEST_CASE("With --tls_cert and --tls_key the gateway speaks TLS only", "[gateway][tls]") {
  TempDir dir;
  const CommandResult made =
      RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                  dir.path() + "/key.pem", "-out", dir.path() + "/cert.pem", "-days", "1", "-subj",
                  "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  Gateway gateway(dir.path());
  httplib::SSLClient tls("127.0.0.1", gateway.port());
  tls.set_ca_cert_path((dir.path() + "/cert.pem").c_str());
  tls.enable_server_certificate_verification(true);
  auto health = tls.Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
  auto cluster = tls.Get("/v1/cluster", gateway.Auth(gateway.token()));
  REQUIRE(cluster);
  CHECK(cluster->status == 200);
  // Plaintext HTTP gets no answer.
  httplib::Client plain("127.0.0.1", gateway.port());
  plain.set_read_timeout(5, 0);
  auto refused = plain.Get("/healthz");
  CHECK((!refused || refused->status != 200));
  // A client that does not trust the certificate does not connect.
  httplib::SSLClient untrusting("127.0.0.1", gateway.port());
  untrusting.enable_server_certificate_verification(true);
  CHECK(!untrusting.Get("/healthz"));
}

// The dashboard in a real browser (headless Chromium): after a job of 4 steps, a screenshot of
// the page and its DOM, whose charts hold that job's points.
TEST_CASE("The dashboard shows a job's curves in a real browser", "[gateway][dashboard]") {
  Gateway gateway;
  REQUIRE(RunFourSteps(gateway) == "job-1");
  TempDir dir;
  // A newer job that fails before its first step: the page still shows job-1, which has steps.
  {
    // Past the rows submission reads (controller::kHeadRows), so the job's start finds it.
    std::ofstream bad(dir.path() + "/bad.jsonl");
    for (int i = 0; i < 16; ++i)
      bad << "{\"prompt\": \"What is 1 + 1?\", \"ground_truth\": \"2\"}\n";
    bad << "{\"prompt\": 3}\n";
  }
  auto failing = gateway.Post("/v1/jobs?" + AbsolutePaths() + "&" +
                                  Override("data.train_files=[" + dir.path() + "/bad.jsonl]"),
                              DemoConfig());
  REQUIRE(failing);
  INFO(failing->body);
  REQUIRE(failing->status == 200);
  REQUIRE(WaitFor(
      [&] {
        auto job = gateway.Get("/v1/jobs/job-2");
        return job && json::parse(job->body)["job"]["state"] == "JOB_STATE_FAILED";
      },
      absl::Seconds(120)));
  const std::string page =
      absl::StrCat("http://rlhfd:", gateway.token(), "@127.0.0.1:", gateway.port(), "/");
  const std::vector<std::string> browser = {"/usr/bin/chromium",
                                            "--headless=new",
                                            "--no-sandbox",
                                            "--disable-gpu",
                                            "--disable-dev-shm-usage",
                                            "--user-data-dir=" + dir.path() + "/profile",
                                            "--window-size=1100,1000",
                                            "--virtual-time-budget=10000"};
  std::vector<std::string> screenshot = browser;
  screenshot.push_back("--screenshot=" + dir.path() + "/dashboard.png");
  screenshot.push_back(page);
  const CommandResult shot = RunCommand(screenshot, absl::Seconds(120));
  INFO(shot.err);
  REQUIRE(shot.exit_code == 0);
  std::string png;
  {
    std::ifstream in(dir.path() + "/dashboard.png", std::ios::binary);
    png.assign(std::istreambuf_iterator<char>(in), {});
  }
  CHECK(png.rfind("\x89PNG", 0) == 0);
  CHECK(png.size() > 20000);  // a drawn page, not a blank one
  std::vector<std::string> dump = browser;
  dump.push_back("--dump-dom");
  dump.push_back(page);
  const CommandResult dom = RunCommand(dump, absl::Seconds(120));
  INFO(dom.out.substr(0, 4000) << dom.err);
  REQUIRE(dom.exit_code == 0);
  CHECK(absl::StrContains(dom.out, "data-loaded=\"true\""));
  CHECK(absl::StrContains(dom.out, "data-metric=\"critic/score/mean\""));
  CHECK(absl::StrContains(dom.out, "data-selected=\"job-1\""));
  CHECK(absl::StrContains(dom.out, "data-job=\"job-1\" data-steps=\"1,2,3,4\""));
  // After the first refresh only the steps from the one running on (the job ended at 4).
  CHECK(absl::StrContains(dom.out, "data-metrics-fetched=\"after step 3\""));
  // The samples panel: the latest step's 4 responses (trainer.log_samples' default).
  CHECK(absl::StrContains(dom.out, "id=\"samples\" data-job=\"job-1\" data-step=\"4\""));
  size_t sample_rows = 0;
  for (size_t at = dom.out.find("class=\"sample\""); at != std::string::npos;
       at = dom.out.find("class=\"sample\"", at + 1)) {
    ++sample_rows;
  }
  CHECK(sample_rows == 4);
  CHECK(absl::StrContains(dom.out, "What is"));
  CHECK(absl::StrContains(dom.out, "cpu-worker-0"));
  CHECK(absl::StrContains(dom.out, "4 / 4"));

  // A running job is shown before a newer one that waits behind it, and the workers' job column
  // names it.
  const auto submit = [&](int64_t steps) {
    auto submitted = gateway.Post("/v1/jobs?" + AbsolutePaths() + "&" +
                                      Override(absl::StrCat("trainer.total_steps=", steps)) + "&" +
                                      Override("trainer.save_every=-1"),
                                  DemoConfig());
    REQUIRE(submitted);
    REQUIRE(submitted->status == 200);
    return json::parse(submitted->body)["job"]["job_id"].get<std::string>();
  };
  const std::string running = submit(100000);
  REQUIRE(WaitFor(
      [&] {
        auto job = gateway.Get("/v1/jobs/" + running);
        return job && json::parse(job->body)["job"]["state"] == "JOB_STATE_RUNNING";
      },
      absl::Seconds(120)));
  const std::string waiting = submit(4);  // queued: both workers are the running job's
  const CommandResult later = RunCommand(dump, absl::Seconds(120));
  INFO(later.out.substr(0, 4000) << later.err);
  REQUIRE(later.exit_code == 0);
  CHECK(absl::StrContains(later.out, "data-selected=\"" + running + "\""));
  size_t cells = 0;  // the two workers' job cells and the job's own row
  const std::string cell = "<td>" + running + "</td>";
  for (size_t at = later.out.find(cell); at != std::string::npos;
       at = later.out.find(cell, at + 1)) {
    ++cells;
  }
  CHECK(cells == 3);
  for (const std::string& id : {waiting, running}) {
    auto cancelled = gateway.Post("/v1/jobs/" + id + ":cancel", "", "text/plain");
    REQUIRE(cancelled);
    CHECK(cancelled->status == 200);
  }
}

}  // namespace
}  // namespace rlhfd::testing

// The job store at 10,000 jobs against a real rlhfd-controller with no workers (every job stays
// QUEUED): ListJobs pages hold each job exactly once, bounded, through gRPC, REST and rlhfctl;
// /metrics counts every job; submitting stays quick with the queue full; a restarted controller
// serves every job soon. The bounds here are loose, for a loaded 2-core machine; the figures are
// controller/bench/job_store_bench's (docs/PERFORMANCE.md).
#include <google/protobuf/util/json_util.h>
#include <grpcpp/client_context.h>
#include <httplib.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/util/files.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/controller_client.h"

namespace rlhfd::testing {
namespace {

const std::string kSource = RLHFD_SOURCE_DIR;
constexpr int kStoredJobs = 10000;
constexpr int kSubmitted = 100;

v1::SubmitJobRequest DemoSubmission() {
  auto text = ReadFileToString(kSource + "/configs/tiny-cpu-demo.yaml");
  REQUIRE(text.ok());
  v1::SubmitJobRequest request;
  request.set_config_text(*text);
  request.set_config_name("tiny-cpu-demo.yaml");
  request.set_base_dir(kSource);
  return request;
}

template <typename Context>
void Deadline(Context* context, int seconds) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

// Every job ListJobs lists, page by page, in order; each page at most `page_size` jobs (or the
// default, 100). Fails the test on a duplicate, a job out of order or an error.
std::vector<std::string> WalkGrpc(const ControllerClient& client, int page_size) {
  std::vector<std::string> ids;
  std::set<std::string> seen;
  v1::ListJobsRequest request;
  request.set_page_size(page_size);
  int pages = 0;
  int64_t last = 0;
  do {
    grpc::ClientContext context;
    client.Authorize(&context);
    Deadline(&context, 30);
    v1::ListJobsReply reply;
    const grpc::Status status = client.jobs->ListJobs(&context, request, &reply);
    INFO(status.error_message());
    REQUIRE(status.ok());
    REQUIRE(reply.jobs_size() <= (page_size == 0 ? 100 : page_size));
    for (const v1::Job& job : reply.jobs()) {
      REQUIRE(seen.insert(job.job_id()).second);
      const int64_t number = std::stoll(job.job_id().substr(4));
      REQUIRE(number > last);
      last = number;
      ids.push_back(job.job_id());
    }
    request.set_page_token(reply.next_page_token());
    REQUIRE(++pages <= kStoredJobs + kSubmitted);
  } while (!request.page_token().empty());
  return ids;
}

// Starts the controller and returns how long it took to answer ListJobs.
absl::Duration StartAndTimeToServe(LocalCluster& cluster, const ControllerClient* client) {
  const absl::Time start = absl::Now();
  std::string error;
  INFO(error);
  REQUIRE(cluster.StartController(&error));
  if (client == nullptr) return absl::Now() - start;
  bool answered = false;
  while (!answered && absl::Now() - start < absl::Seconds(120)) {
    grpc::ClientContext context;
    client->Authorize(&context);
    Deadline(&context, 1);
    v1::ListJobsRequest first;
    first.set_page_size(1);
    v1::ListJobsReply reply;
    answered = client->jobs->ListJobs(&context, first, &reply).ok() && reply.jobs_size() >= 1;
  }
  REQUIRE(answered);
  return absl::Now() - start;
}

TEST_CASE("10,000 jobs: listed once a page at a time, counted, served after a restart",
          "[integration]") {
  LocalCluster cluster({RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN}, absl::Seconds(2),
                       absl::Seconds(10));
  const std::string http_port_file = cluster.state_dir() + "/http.port";
  cluster.SetExtraFlags({"--http_listen=127.0.0.1:0", "--http_port_file=" + http_port_file}, {});
  StartAndTimeToServe(cluster, nullptr);
  auto connected = ConnectToController(cluster);
  REQUIRE(connected.ok());
  const ControllerClient& client = *connected;

  // One job through the API gives the record every stored job copies.
  const v1::SubmitJobRequest submit = DemoSubmission();
  std::string record;
  {
    grpc::ClientContext context;
    client.Authorize(&context);
    Deadline(&context, 30);
    v1::SubmitJobReply reply;
    const grpc::Status status = client.jobs->SubmitJob(&context, submit, &reply);
    INFO(status.error_message());
    REQUIRE(status.ok());
    REQUIRE(google::protobuf::util::MessageToJsonString(reply.job(), &record).ok());
  }
  REQUIRE(cluster.StopController(SIGTERM).has_value());

  // 10,000 jobs as files of the file-per-job store (which the controller imports, once): quicker
  // to make than 10,000 submissions, and readable by the controllers before the job database too.
  const std::string jobs_dir = cluster.state_dir() + "/jobs";
  for (const char* name : {"jobs.db", "jobs.db-wal", "jobs.db-shm"}) {
    REQUIRE(RemoveTree(cluster.state_dir() + "/" + name).ok());
  }
  REQUIRE(MakeDirectories(jobs_dir).ok());
  for (int n = 1; n <= kStoredJobs; ++n) {
    std::ofstream(absl::StrCat(jobs_dir, "/job-", n, ".json"))
        << absl::StrReplaceAll(record, {{"\"job-1\"", absl::StrCat("\"job-", n, "\"")}});
  }
  std::ofstream(jobs_dir + "/next_job_number") << kStoredJobs + 1 << "\n";
  const absl::Duration first_start = StartAndTimeToServe(cluster, &client);
  WARN("first start (imports 10,000 job files): " << absl::FormatDuration(first_start));

  // Submitting with 10,000 jobs queued: each answered quickly (a loose bound; the bench has the
  // figures), each new job queued with the next number.
  std::vector<double> latencies;
  for (int i = 1; i <= kSubmitted; ++i) {
    grpc::ClientContext context;
    client.Authorize(&context);
    Deadline(&context, 30);
    v1::SubmitJobReply reply;
    const absl::Time start = absl::Now();
    const grpc::Status status = client.jobs->SubmitJob(&context, submit, &reply);
    latencies.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    INFO(status.error_message());
    REQUIRE(status.ok());
    CHECK(reply.job().job_id() == absl::StrCat("job-", kStoredJobs + i));
    CHECK(reply.job().state() == v1::JOB_STATE_QUEUED);
    // Every job has the demo's name: the same-name warning names a few, not 10,000.
    CHECK(reply.warnings_size() <= 5);
  }
  std::sort(latencies.begin(), latencies.end());
  WARN("submit p50 at 10,000 queued: " << latencies[latencies.size() / 2] << " ms");
  CHECK(latencies[latencies.size() / 2] < 100);

  // gRPC: every job once, in order, in pages of the size asked for (and of the default).
  constexpr int kAll = kStoredJobs + kSubmitted;
  const std::vector<std::string> listed = WalkGrpc(client, 1000);
  REQUIRE(listed.size() == kAll);
  CHECK(listed.front() == "job-1");
  CHECK(listed.back() == absl::StrCat("job-", kAll));
  CHECK(WalkGrpc(client, 0).size() == kAll);

  // REST: the same pages; a forged token is a 400 that names page_token.
  auto port = ReadFileToString(http_port_file, 64);
  REQUIRE(port.ok());
  httplib::Client http("127.0.0.1", std::stoi(*port));
  http.set_read_timeout(30, 0);
  const httplib::Headers auth = {{"Authorization", "Bearer " + client.token}};
  std::set<std::string> rest_seen;
  std::string token;
  for (int pages = 0;; ++pages) {
    REQUIRE(pages <= kAll / 500 + 1);
    const auto reply = http.Get(
        ("/v1/jobs?page_size=500" + (token.empty() ? "" : "&page_token=" + token)).c_str(), auth);
    REQUIRE(reply);
    REQUIRE(reply->status == 200);
    const nlohmann::json page = nlohmann::json::parse(reply->body);
    REQUIRE(page["jobs"].size() <= 500);
    for (const auto& job : page["jobs"]) {
      REQUIRE(rest_seen.insert(job["job_id"].get<std::string>()).second);
    }
    token = page["next_page_token"].get<std::string>();  // web-safe base64: no escaping needed
    if (token.empty()) break;
  }
  CHECK(rest_seen.size() == kAll);
  const auto forged = http.Get("/v1/jobs?page_token=bm90LWEtdG9rZW4", auth);
  REQUIRE(forged);
  CHECK(forged->status == 400);
  CHECK(forged->body.find("page_token") != std::string::npos);

  // /metrics counts every job, not a page of them.
  const auto metrics = http.Get("/metrics", auth);
  REQUIRE(metrics);
  CHECK(metrics->body.find(absl::StrCat("rlhfd_jobs{state=\"queued\"} ", kAll, "\n")) !=
        std::string::npos);

  // rlhfctl follows the pages: a row per job.
  const CommandResult table = cluster.Ctl({"jobs"});
  INFO(table.err);
  REQUIRE(table.exit_code == 0);
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(table.out, '\n'))
    rows += line.substr(0, 4) == "job-";
  CHECK(rows == kAll);

  // A restart serves every job, soon (loose bound: the bench measures it).
  REQUIRE(cluster.StopController(SIGTERM).has_value());
  const absl::Duration restart = StartAndTimeToServe(cluster, &client);
  WARN("restart with " << kAll << " jobs to ListJobs answered: " << absl::FormatDuration(restart));
  CHECK(restart < absl::Seconds(10));
  CHECK(WalkGrpc(client, 1000) == listed);
}

}  // namespace
}  // namespace rlhfd::testing

// A real rlhfd-controller and two real rlhfd-workers on loopback, driven through rlhfctl: workers
// register, a killed worker is marked lost, a restarted controller gets its workers and jobs
// back, configs are accepted or refused with their reason, and a wrong token is refused.
#include <catch2/catch.hpp>
#include <signal.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "tests/support/cluster_fixture.h"

namespace rlhfd::testing {
namespace {

constexpr absl::Duration kHeartbeat = absl::Milliseconds(200);
constexpr absl::Duration kLivenessWindow = absl::Seconds(1);

LocalClusterBinaries Binaries() {
  return {RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN};
}

nlohmann::json CtlJson(const LocalCluster& cluster, std::vector<std::string> args) {
  args.insert(args.begin(), "--json");
  CommandResult result = cluster.Ctl(args);
  INFO("rlhfctl stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  return nlohmann::json::parse(result.out);
}

// Worker id → state name, from `rlhfctl --json workers`.
std::map<std::string, std::string> WorkerStates(const LocalCluster& cluster) {
  std::map<std::string, std::string> states;
  CommandResult result = cluster.Ctl({"--json", "workers"});
  if (result.exit_code != 0) {
    UNSCOPED_INFO("rlhfctl workers failed (" << result.exit_code << "): " << result.err);
    return states;
  }
  const nlohmann::json reply = nlohmann::json::parse(result.out);
  for (const auto& worker : reply["workers"]) {
    states[worker["worker_id"]] = worker["state"];
  }
  return states;
}

bool BothAlive(const LocalCluster& cluster) {
  auto states = WorkerStates(cluster);
  return states.size() == 2 && states["cpu-worker-0"] == "WORKER_STATE_ALIVE" &&
         states["cpu-worker-1"] == "WORKER_STATE_ALIVE";
}

}  // namespace

TEST_CASE("controller, workers and rlhfctl on loopback", "[integration]") {
  LocalCluster cluster(Binaries(), kHeartbeat, kLivenessWindow);
  std::string error;
  REQUIRE(cluster.StartController(&error));
  INFO(error);
  cluster.StartWorker();
  cluster.StartWorker();
  REQUIRE(WaitFor([&] { return BothAlive(cluster); }, absl::Seconds(20)));

  // The table for people lists both workers.
  CommandResult table = cluster.Ctl({"workers"});
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("cpu-worker-0") && Catch::Contains("cpu-worker-1") &&
                            Catch::Contains("alive") && Catch::Contains("cpu"));

  // A wrong token is refused; the controller is unaffected.
  CommandResult wrong = cluster.CtlWithToken("not-the-token", {"workers"});
  CHECK(wrong.exit_code == 1);
  CHECK_THAT(wrong.err, Catch::Contains("wrong bearer token"));

  // An example config is accepted and queued.
  CommandResult submitted =
      cluster.Ctl({"submit", std::string(RLHFD_CONFIGS_DIR) + "/grpo-gsm8k-qwen05b.yaml",
                   std::string("model.path=") + RLHFD_FIXTURES_DIR + "/models/tiny-qwen2",
                   std::string("data.train_files=") + RLHFD_FIXTURES_DIR +
                       "/data/arithmetic_train.jsonl",
                   std::string("data.val_files=") + RLHFD_FIXTURES_DIR +
                       "/data/arithmetic_train.jsonl"});
  INFO(submitted.err);
  REQUIRE(submitted.exit_code == 0);
  CHECK_THAT(submitted.out, Catch::Contains("submitted job-1 (grpo-gsm8k-qwen05b): queued"));
  nlohmann::json jobs = CtlJson(cluster, {"jobs"});
  REQUIRE(jobs["jobs"].size() == 1);
  CHECK(jobs["jobs"][0]["state"] == "JOB_STATE_QUEUED");
  CHECK(jobs["jobs"][0]["spec"]["name"] == "grpo-gsm8k-qwen05b");

  // An invalid config is refused with its reason, and nothing else changes.
  TempDir configs;
  const std::string bad = configs.path() + "/bad.yaml";
  REQUIRE(WriteFileAtomically(bad, "name: bad\nmodel: {path: /m}\nroles: {actor: {gpu: 2}}\n").ok());
  CommandResult refused = cluster.Ctl({"submit", bad});
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Contains(bad + ": roles.actor.gpu: unknown key; did you mean 'gpus'?"));
  CHECK(CtlJson(cluster, {"jobs"})["jobs"].size() == 1);
  CHECK(cluster.controller()->running());

  // A watcher sees the job's state and then its cancellation, and ends with it.
  Subprocess watcher({RLHFD_CTL_BIN, "--controller=" + cluster.address(),
                      "--token_file=" + cluster.state_dir() + "/token", "watch", "job-1"},
                     configs.path() + "/watch.log");
  REQUIRE(WaitFor([&] { return watcher.ReadLog().find("queued") != std::string::npos; },
                  absl::Seconds(10)));
  CommandResult cancelled = cluster.Ctl({"cancel", "job-1"});
  CHECK(cancelled.exit_code == 0);
  CHECK(watcher.Wait(absl::Seconds(10)) == std::optional<int>(0));
  CHECK_THAT(watcher.ReadLog(), Catch::Contains("cancelled"));
  CHECK(cluster.Ctl({"cancel", "job-1"}).exit_code == 1);  // Already ended.
  CHECK(cluster.Ctl({"status", "job-404"}).exit_code == 1);

  // A drained worker stays drained through a controller restart, until undrained.
  CHECK(cluster.Ctl({"drain", "cpu-worker-0"}).exit_code == 0);
  CHECK(WorkerStates(cluster)["cpu-worker-0"] == "WORKER_STATE_DRAINING");

  // SIGTERM drains and exits 0; a restarted controller gets both workers and the job back.
  REQUIRE(cluster.StopController(SIGTERM) == std::optional<int>(0));
  REQUIRE(cluster.StartController(&error));
  CHECK(WaitFor([&] { return WorkerStates(cluster).size() == 2; }, absl::Seconds(20)));
  CHECK(WorkerStates(cluster)["cpu-worker-0"] == "WORKER_STATE_DRAINING");
  CommandResult undrained = cluster.Ctl({"undrain", "cpu-worker-0"});
  CHECK(undrained.exit_code == 0);
  CHECK_THAT(undrained.out, Catch::Contains("undrained cpu-worker-0"));
  CHECK(WaitFor([&] { return BothAlive(cluster); }, absl::Seconds(20)));
  CHECK(cluster.Ctl({"undrain", "cpu-worker-0"}).exit_code == 1);  // Not drained any more.
  nlohmann::json status = CtlJson(cluster, {"status", "job-1"});
  CHECK(status["job"]["state"] == "JOB_STATE_CANCELLED");

  // A killed worker is marked lost within the liveness window (plus one sweep).
  cluster.worker(1).Stop(SIGKILL, absl::Seconds(5));
  const absl::Time killed = absl::Now();
  REQUIRE(WaitFor([&] { return WorkerStates(cluster)["cpu-worker-1"] == "WORKER_STATE_LOST"; },
                  absl::Seconds(10)));
  CHECK(absl::Now() - killed < kLivenessWindow + absl::Seconds(2));
  CHECK(WorkerStates(cluster)["cpu-worker-0"] == "WORKER_STATE_ALIVE");
  CHECK(cluster.worker(0).running());
}

// Makes a CA, and a server and a client certificate it signs, with openssl.
void MakeCertificates(const std::string& dir) {
  auto openssl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/bin/openssl");
    CommandResult result = RunCommand(args);
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
  };
  REQUIRE(WriteFileAtomically(dir + "/san.cnf", "subjectAltName=IP:127.0.0.1,DNS:localhost\n").ok());
  openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", dir + "/ca.key", "-out",
           dir + "/ca.pem", "-days", "1", "-subj", "/CN=rlhfd-test-ca"});
  for (const std::string name : {"server", "client"}) {
    openssl({"req", "-newkey", "rsa:2048", "-nodes", "-keyout", dir + "/" + name + ".key", "-out",
             dir + "/" + name + ".csr", "-subj", "/CN=localhost"});
    openssl({"x509", "-req", "-in", dir + "/" + name + ".csr", "-CA", dir + "/ca.pem", "-CAkey",
             dir + "/ca.key", "-CAcreateserial", "-out", dir + "/" + name + ".pem", "-days", "1",
             "-extfile", dir + "/san.cnf"});
  }
}

TEST_CASE("mutual TLS: certified clients get in, plaintext and uncertified ones do not",
          "[integration][tls]") {
  TempDir certs;
  MakeCertificates(certs.path());
  const std::string dir = certs.path();
  LocalCluster cluster(Binaries(), kHeartbeat, kLivenessWindow);
  cluster.SetExtraFlags({"--tls_cert=" + dir + "/server.pem", "--tls_key=" + dir + "/server.key",
                         "--tls_ca=" + dir + "/ca.pem", "--tls_require_client_cert"},
                        {"--tls_ca=" + dir + "/ca.pem", "--tls_cert=" + dir + "/client.pem",
                         "--tls_key=" + dir + "/client.key"});
  std::string error;
  REQUIRE(cluster.StartController(&error));
  cluster.StartWorker();
  REQUIRE(WaitFor([&] { return WorkerStates(cluster)["cpu-worker-0"] == "WORKER_STATE_ALIVE"; },
                  absl::Seconds(20)));

  const std::vector<std::string> base = {RLHFD_CTL_BIN, "--controller=" + cluster.address(),
                                         "--token_file=" + cluster.state_dir() + "/token",
                                         "--timeout=3s"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("workers");
    return RunCommand(argv);
  };
  CHECK(with({}).exit_code == 1);                                  // Plaintext.
  CHECK(with({"--tls_ca=" + dir + "/ca.pem"}).exit_code == 1);     // No client certificate.
  CHECK(with({"--tls_ca=" + dir + "/ca.pem", "--tls_cert=" + dir + "/client.pem",
              "--tls_key=" + dir + "/client.key"})
            .exit_code == 0);
  CommandResult half = with({"--tls_ca=" + dir + "/ca.pem", "--tls_cert=" + dir + "/client.pem"});
  CHECK(half.exit_code != 0);
}

TEST_CASE("the controller refuses to start where it cannot listen", "[integration]") {
  LocalCluster first(Binaries(), kHeartbeat, kLivenessWindow);
  std::string error;
  REQUIRE(first.StartController(&error));
  CommandResult clash = RunCommand({RLHFD_CONTROLLER_BIN, "--listen=" + first.address(),
                                    "--state_dir=" + first.state_dir() + "-other"});
  CHECK(clash.exit_code == 1);
  CHECK_THAT(clash.err, Catch::Contains("cannot listen on " + first.address()));
}

TEST_CASE("rlhfctl usage errors exit 2 with help", "[integration]") {
  CommandResult none = RunCommand({RLHFD_CTL_BIN});
  CHECK(none.exit_code == 2);
  CHECK_THAT(none.err, Catch::Contains("Jobs:") && Catch::Contains("Cluster:"));
  CommandResult unknown = RunCommand({RLHFD_CTL_BIN, "--token=x", "frobnicate"});
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.err, Catch::Contains("unknown command 'frobnicate'"));
  CommandResult missing_arg = RunCommand({RLHFD_CTL_BIN, "--token=x", "submit"});
  CHECK(missing_arg.exit_code == 2);
  CommandResult unreachable =
      RunCommand({RLHFD_CTL_BIN, "--token=x", "--controller=127.0.0.1:1", "--timeout=1s", "jobs"});
  CHECK(unreachable.exit_code == 1);
  CHECK_THAT(unreachable.err, Catch::Contains("is rlhfd-controller running"));
}

}  // namespace rlhfd::testing

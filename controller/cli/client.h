// rlhfctl's connection to the controller: the exit codes, the address, the stubs with the token
// and deadline on every call, and the calls more than one command makes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "rlhfd/v1/cluster_service.grpc.pb.h"
#include "rlhfd/v1/job_service.grpc.pb.h"

namespace rlhfd::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// --controller, else $RLHFD_CONTROLLER, else 127.0.0.1:50051.
std::string ControllerAddress();

class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, std::string token)
      : jobs_(v1::JobService::NewStub(channel)),
        cluster_(v1::ClusterService::NewStub(channel)),
        token_(std::move(token)) {}

  // The token, and the --timeout deadline unless the call lasts as long as the job (a watch).
  void Prepare(grpc::ClientContext* context, bool with_deadline = true) const;

  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::ClusterService::Stub& cluster() { return *cluster_; }

 private:
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
  std::string token_;
};

// Prints the error (with a hint when the controller is not reached); kExitFailed.
int Fail(const grpc::Status& status);

absl::StatusOr<v1::Job> GetJob(Client& client, const std::string& job_id);
// The job's recorded steps after `after_step`.
absl::StatusOr<v1::GetJobMetricsReply> GetMetrics(Client& client, const std::string& job_id,
                                                  int64_t after_step);

}  // namespace rlhfd::cli

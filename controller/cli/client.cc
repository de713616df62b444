#include "controller/cli/client.h"

#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "controller/cli/cli_flags.h"

namespace rlhfd::cli {

std::string ControllerAddress() {
  std::string address = absl::GetFlag(FLAGS_controller);
  if (address.empty()) {
    const char* env = std::getenv("RLHFD_CONTROLLER");
    address = env != nullptr && *env != '\0' ? env : "127.0.0.1:50051";
  }
  return address;
}

void Client::Prepare(grpc::ClientContext* context, bool with_deadline) const {
  AttachToken(context, token_);
  if (with_deadline) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
  }
}

int Fail(const grpc::Status& status) {
  std::string hint;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    hint = absl::StrCat("\nhint: is rlhfd-controller running at ", ControllerAddress(),
                        "? Set --controller or $RLHFD_CONTROLLER.");
  }
  std::cerr << "error: " << status.error_message() << hint << "\n";
  return kExitFailed;
}

absl::StatusOr<v1::Job> GetJob(Client& client, const std::string& job_id) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobReply reply;
  if (auto status = client.jobs().GetJob(&context, request, &reply); !status.ok()) {
    return FromGrpcStatus(status);
  }
  return reply.job();
}

absl::StatusOr<v1::GetJobMetricsReply> GetMetrics(Client& client, const std::string& job_id,
                                                  int64_t after_step) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::GetJobMetricsRequest request;
  request.set_job_id(job_id);
  request.set_after_step(after_step);
  v1::GetJobMetricsReply reply;
  if (auto status = client.jobs().GetJobMetrics(&context, request, &reply); !status.ok()) {
    return FromGrpcStatus(status);
  }
  return reply;
}

}  // namespace rlhfd::cli

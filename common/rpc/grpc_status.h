// Conversions between absl::Status (module boundaries) and grpc::Status (process boundaries).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace rlhfd {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Both enums follow google.rpc.Code, so the numeric values line up.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace rlhfd

// CallStage's template body (stage_service.h).
#pragma once

#include <future>
#include <memory>

namespace rlhfd::stages {

template <typename Request, typename Reply>
absl::StatusOr<Reply> CallStage(StageService& service,
                                void (StageService::*method)(const Request&, absl::Duration,
                                                             StageDone<Reply>),
                                const Request& request, absl::Duration deadline) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<Reply>>>();
  std::future<absl::StatusOr<Reply>> result = promise->get_future();
  (service.*method)(request, deadline, [promise](absl::StatusOr<Reply> reply) {
    promise->set_value(std::move(reply));
  });
  return result.get();
}

}  // namespace rlhfd::stages

// The template bodies of stage_service.h: CallStage, StageMethodName.
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

template <typename Request, typename Reply>
std::string_view StageMethodName(void (StageService::*method)(const Request&, absl::Duration,
                                                              StageDone<Reply>)) {
  // Stages of one request type (UpdateActor and UpdateCritic, the checkpoint calls) are told
  // apart by the member pointer itself.
#define RLHFD_STAGE_METHOD_NAME(Name, StageRequest, StageReply) \
  if constexpr (std::is_same_v<Request, v1::StageRequest> &&    \
                std::is_same_v<Reply, v1::StageReply>) {        \
    if (method == &StageService::Name) return #Name;            \
  }
  RLHFD_STAGES(RLHFD_STAGE_METHOD_NAME)
#undef RLHFD_STAGE_METHOD_NAME
  return {};
}

}  // namespace rlhfd::stages

// The RL stages of one worker as the driver sees them: plain methods over the worker_service
// protos, asynchronous, with no transport in sight. Implemented in process by the worker's role
// host (tests drive the driver against it) and over gRPC by MakeGrpcStageService (the
// controller's driver against real workers). No LibTorch.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace rlhfd::stages {

// Runs once with the reply or the error, on a thread of the implementation.
template <typename Reply>
using StageDone = std::function<void(absl::StatusOr<Reply>)>;

// Every stage as (method, request, reply), in worker_service.proto's order: the one list the
// interface, the gRPC client and the worker's gRPC adapter are stamped from.
#define RLHFD_STAGES(X)                                         \
  X(PrepareJob, PrepareJobRequest, PrepareJobReply)             \
  X(StartJob, StartJobRequest, StartJobReply)                   \
  X(Generate, GenerateRequest, GenerateReply)                   \
  X(SyncWeights, SyncWeightsRequest, SyncWeightsReply)          \
  X(MoveTensors, MoveTensorsRequest, MoveTensorsReply)          \
  X(Forward, ForwardRequest, ForwardReply)                      \
  X(ComputeRewards, RewardRequest, RewardReply)                 \
  X(ComputeAdvantages, AdvantageRequest, AdvantageReply)        \
  X(UpdateActor, UpdateRequest, UpdateReply)                    \
  X(UpdateCritic, UpdateRequest, UpdateReply)                   \
  X(Validate, ValidateRequest, ValidateReply)                   \
  X(SaveCheckpoint, CheckpointRequest, CheckpointReply)         \
  X(CommitCheckpoint, CheckpointRequest, CheckpointReply)       \
  X(LoadCheckpoint, CheckpointRequest, CheckpointReply)         \
  X(Offload, OffloadRequest, OffloadReply)                      \
  X(DumpBatch, DumpBatchRequest, DumpBatchReply)                \
  X(MeasurePrompts, MeasurePromptsRequest, MeasurePromptsReply) \
  X(EndJob, EndJobRequest, EndJobReply)

class StageService {
 public:
  virtual ~StageService() = default;

  // Each call ends within `deadline` of being made (DEADLINE_EXCEEDED) over gRPC; in process the
  // stage's own timeouts (collectives, remote rewards) bound it.
#define RLHFD_DECLARE_STAGE(Name, Request, Reply)                        \
  virtual void Name(const v1::Request& request, absl::Duration deadline, \
                    StageDone<v1::Reply> done) = 0;
  RLHFD_STAGES(RLHFD_DECLARE_STAGE)
#undef RLHFD_DECLARE_STAGE

  // Has this rank's worker make `request`'s stage calls to other ranks (fan-out through the
  // workers: worker_service.proto's Relay). Only over gRPC: in process there is nothing to relay.
  virtual void Relay(const v1::RelayRequest& request, absl::Duration deadline,
                     StageDone<v1::RelayReply> done) {
    (void)request;
    (void)deadline;
    done(absl::UnimplementedError("this stage service relays no calls"));
  }

  // Ends every call in flight now (their replies: CANCELLED), where the transport can; a
  // cancelled job's driver uses it so as not to wait for stages it no longer needs.
  virtual void CancelCalls() {}
};

// The WorkerService method of a stage ("Forward", "UpdateCritic"); empty for no stage.
template <typename Request, typename Reply>
std::string_view StageMethodName(void (StageService::*method)(const Request&, absl::Duration,
                                                              StageDone<Reply>));

// How much sooner than a relay's own deadline the calls it makes end: the relaying worker then
// still answers in time to name the ranks that did not (a twentieth, at most a second).
inline absl::Duration RelayCallMargin(absl::Duration deadline) {
  return std::clamp(deadline / 20, absl::ZeroDuration(), absl::Seconds(1));
}

// Calls `method` and waits for its reply: for drivers on a thread of their own.
template <typename Request, typename Reply>
absl::StatusOr<Reply> CallStage(StageService& service,
                                void (StageService::*method)(const Request&, absl::Duration,
                                                             StageDone<Reply>),
                                const Request& request, absl::Duration deadline);

// The stages of the worker behind `channel`; every call carries `token`.
std::unique_ptr<StageService> MakeGrpcStageService(std::shared_ptr<grpc::Channel> channel,
                                                   std::string token);

}  // namespace rlhfd::stages

#include "common/stages/stage_service_inl.h"

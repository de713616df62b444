// What a job's state means, in one place for the controller, rlhfctl and the tests.
#pragma once

#include <vector>

#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd {

// Succeeded, failed or cancelled: the job's state never changes again.
inline bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// Queued or recovering: the job waits for placement.
inline bool IsWaiting(v1::JobState state) {
  return state == v1::JOB_STATE_QUEUED || state == v1::JOB_STATE_RECOVERING;
}

// The states of a job that holds workers or is on its way back to them (placing, starting,
// running, recovering): the jobs a controller restart recovers and /metrics reports per job.
inline std::vector<v1::JobState> ActiveJobStates() {
  return {v1::JOB_STATE_PLACING, v1::JOB_STATE_STARTING, v1::JOB_STATE_RUNNING,
          v1::JOB_STATE_RECOVERING};
}

}  // namespace rlhfd

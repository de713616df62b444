// A verl custom_reward_function, unchanged: compute_score(data_source, solution_str,
// ground_truth, extra_info, **reward_kwargs) run by a pool of Python processes this worker owns
// (worker/reward/python/reward_runner.py). Each process imports the user's file once and answers
// one call at a time over a socket; this side holds every call to its deadline with poll() and
// kills (SIGKILL) and replaces a process that overruns or dies. Processes start with an
// address-space limit and end within a second of the worker (the runner watches its parent).
//
// Wire format (both ways): a decimal byte count, "\n", then that many bytes of one JSON object.
//   first, to the runner:  {"worker_pid", "path", "name", "reward_kwargs"}
//   runner:                {"ready": true} | {"error": exception, "traceback": text}
//   per call:              {"id", "data_source", "solution_str", "ground_truth", "extra_info"}
//   runner:                {"id", "score": number} | {"id", "error": what, "traceback"?: text}
// ("traceback" when the function raised: its frames in the user's code, then the exception.)
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/python_reward_limits.h"
#include "nlohmann/json.hpp"

namespace rlhfd::reward {

struct PythonRewardOptions {
  // The interpreter; "" means $RLHFD_PYTHON, else python3 on the worker's PATH.
  std::string python;
  // reward_runner.py; "" means the one installed with the worker (RewardRunnerPath()).
  std::string runner;
  std::string path;  // the user's .py file (or pkg://module.name, as verl accepts)
  std::string name = config::kPythonRewardFunctionName;
  nlohmann::json reward_kwargs = nlohmann::json::object();
  int processes = config::kPythonRewardProcesses;
  // Per call; importing the file gets the same.
  absl::Duration timeout = absl::Seconds(config::kPythonRewardTimeoutS);
  // RLIMIT_AS of each process; <= 0 for none.
  int64_t memory_limit_mb = config::kPythonRewardMemoryLimitMb;
};

// One call, with the arguments verl's reward manager passes.
struct PythonRewardCall {
  std::string data_source;
  std::string solution_str;     // the decoded response
  nlohmann::json ground_truth;  // as the data file holds it
  nlohmann::json extra_info;    // the row's extra_info object (null: none)
};

class PythonReward {
 public:
  // Starts one process and waits until it has imported the file and found the function:
  // INVALID_ARGUMENT with the import's traceback when it cannot; FAILED_PRECONDITION when the
  // interpreter or the runner is missing. The other processes start on first use.
  static absl::StatusOr<std::unique_ptr<PythonReward>> Create(PythonRewardOptions options);
  ~PythonReward();
  PythonReward(const PythonReward&) = delete;
  PythonReward& operator=(const PythonReward&) = delete;

  // One score per call, in order. A call that raises, returns something other than a number or
  // a dict with a numeric "score", overruns the deadline or kills its process fails the whole
  // batch: INVALID_ARGUMENT with the function's traceback (or what happened to the process)
  // naming the row (`first_row` + the call's index), an overrun included (it is the function's
  // doing, not a fault to retry); CANCELLED when `cancelled` turns true. Processes that were busy
  // are replaced, so the pool serves the next batch. Batches from several threads take turns.
  absl::StatusOr<std::vector<double>> Score(const std::vector<PythonRewardCall>& calls,
                                            int64_t first_row = 0,
                                            const std::atomic<bool>* cancelled = nullptr);

  // Processes started since creation (restarts included), for tests.
  int64_t started() const { return started_; }
  // Process ids of the live processes, for tests.
  std::vector<pid_t> pids() const;

 private:
  struct Process;
  explicit PythonReward(PythonRewardOptions options);
  // Starts `process` and waits for its "ready" (or its import error).
  absl::Status Start(Process& process);
  void Kill(Process& process);

  PythonRewardOptions options_;
  std::string python_;  // resolved interpreter path
  std::string setup_;   // the first message, framed
  std::vector<std::unique_ptr<Process>> processes_;
  int64_t started_ = 0;
  std::mutex mutex_;  // one batch at a time
};

// reward_runner.py beside the running executable: <bin>/reward_runner.py (the build tree) or
// <bin>/../share/rlhfd/reward_runner.py (an install); "" when neither exists.
std::string RewardRunnerPath();

}  // namespace rlhfd::reward

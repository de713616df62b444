// What a Python reward function's pool (roles.reward.custom_reward_function) defaults to and
// may be set to: read by the config validator and by the worker's pool, one copy of each.
#pragma once

#include <cstdint>

namespace rlhfd::config {

// verl's default function name.
inline constexpr char kPythonRewardFunctionName[] = "compute_score";
inline constexpr int kPythonRewardProcesses = 4;
inline constexpr int kMaxPythonRewardProcesses = 64;
inline constexpr double kPythonRewardTimeoutS = 30;
inline constexpr double kMaxPythonRewardTimeoutS = 3600;
// RLIMIT_AS of each process, MiB; -1 in a config for none.
inline constexpr int64_t kPythonRewardMemoryLimitMb = 8192;
inline constexpr int64_t kMinPythonRewardMemoryLimitMb = 64;

}  // namespace rlhfd::config

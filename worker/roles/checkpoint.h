// Checkpoints of a job's trained roles: per role and rank,
//   <dir>/step_<N>/<role>/rank_<r>/state.safetensors   the rank's training state (parameters or
//                                                       shards, optimiser moments, step counts)
//   <dir>/step_<N>/<role>/rank_<r>/manifest.json       written last: the step, what the state
//                                                       holds, and its size
// and <dir>/latest naming the newest step every rank saved, replaced atomically by world rank 0
// once all have. A directory without its manifest (a save cut short) is never loaded; `latest`
// still names the step before it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

std::string StepDirectory(const std::string& dir, int64_t step);
std::string RankDirectory(const std::string& dir, int64_t step, const std::string& role, int rank);

// Writes the state, then the manifest (with `extra` under "extra"). Returns the bytes written.
// FAILED_PRECONDITION naming the tensor, and nothing written, when a tensor holds NaN or inf.
absl::StatusOr<int64_t> SaveRoleState(const std::string& dir, int64_t step,
                                      const std::string& role, int rank,
                                      const train::TrainedModel::NamedTensors& state,
                                      const nlohmann::json& extra);

// Points <dir>/latest at `step` after checking this rank's manifests of it are there.
absl::Status CommitLatest(const std::string& dir, int64_t step);

// The step `latest` names (NOT_FOUND when there is none), or `step` itself when > 0.
absl::StatusOr<int64_t> ResolveStep(const std::string& dir, int64_t step);

// Copies the saved state into `state` (the same names, shapes and dtypes) and returns the
// manifest's extra. FAILED_PRECONDITION for a save without its manifest; INVALID_ARGUMENT naming
// the tensor that does not match.
absl::StatusOr<nlohmann::json> LoadRoleState(const std::string& dir, int64_t step,
                                             const std::string& role, int rank,
                                             const train::TrainedModel::NamedTensors& state);

}  // namespace rlhfd::roles

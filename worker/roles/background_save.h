// A checkpoint save on a thread of its own (trainer.async_save): each trained role's state is
// copied to host memory when the save starts, so training goes on changing the weights while
// the copy is written with SaveRoleState (checkpoint.h). The driver commits the step once every
// rank's save is durable.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "worker/roles/checkpoint.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

class BackgroundSave {
 public:
  // One role's part of the step, as SaveRoleState takes it.
  struct Part {
    std::string role;
    int rank = 0;
    train::TrainedModel::NamedTensors state;
    nlohmann::json extra;
  };

  // What runs on the save's thread besides the writing; a failure of either is the save's.
  struct Around {
    // Before the writing: world rank 0 commits the step saved before this one.
    std::function<absl::Status()> first;
    // After each part is written: its upload (trainer.checkpoint_uri).
    std::function<absl::Status(const Part&)> then;
    // Delays the writing that long (fault drills: the worker's --fault_hold_background_save), so
    // a drill finds the save in flight and training well past the copy.
    absl::Duration hold = absl::ZeroDuration();
  };

  // Copies each part's tensors to host memory (on the calling thread: the caller may change
  // them once this returns), then writes them under `dir` as step `step` of `writer` on a thread.
  static std::unique_ptr<BackgroundSave> Start(std::string dir, int64_t step,
                                               CheckpointWriter writer, std::vector<Part> parts,
                                               Around around);
  static std::unique_ptr<BackgroundSave> Start(std::string dir, int64_t step,
                                               CheckpointWriter writer, std::vector<Part> parts) {
    return Start(std::move(dir), step, std::move(writer), std::move(parts), Around());
  }
  // Waits for the write: a save is never left half done behind its owner's back.
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  int64_t step() const { return step_; }
  // Bytes of host memory the copy holds.
  int64_t copied_bytes() const { return copied_bytes_; }
  // Waits until the write has ended: the bytes of tensor data written, or why it failed
  // (SaveRoleState removed that part's files).
  absl::StatusOr<int64_t> Wait();

 private:
  BackgroundSave(int64_t step, int64_t copied_bytes) : step_(step), copied_bytes_(copied_bytes) {}

  int64_t step_;
  int64_t copied_bytes_;
  absl::StatusOr<int64_t> written_ = 0;  // set by the thread, read after it is joined
  std::thread thread_;
};

}  // namespace rlhfd::roles

// What the checkpoint and offload stages need of a role, whichever role it is: the tensors it
// keeps on the device, and for a trained role its state and counters. The stages iterate over
// these instead of asking each role by name.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "worker/train/trained_model.h"

namespace rlhfd::roles {

class HostedRole {
 public:
  virtual ~HostedRole() = default;
  // The tensors an offload moves between the device and the host (they are moved in place).
  virtual std::vector<at::Tensor> ResidentTensors() = 0;
  // Frees what is derived from the weights (the actor's rollout copy and KV cache) before the
  // weights move or are overwritten; it is rebuilt when next needed.
  virtual void ReleaseDerived() {}
};

// A role whose weights train: a checkpoint saves and loads its state and counters.
class TrainedRole : public HostedRole {
 public:
  virtual train::TrainedModel& trained() = 0;
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t steps) = 0;
  // Optimiser steps skipped for a non-finite loss or gradient norm in the run so far
  // (trainer.max_nonfinite_skips bounds them; checkpoints keep the count).
  virtual int64_t nonfinite_skips() const = 0;
  virtual void set_nonfinite_skips(int64_t skips) = 0;

  // The training state, and the frozen parameters it leaves out (a LoRA actor's base, which a
  // reference on the same worker reads through the actor).
  std::vector<at::Tensor> ResidentTensors() override {
    std::vector<at::Tensor> tensors;
    for (auto& [name, tensor] : trained().StateTensors()) tensors.push_back(tensor);
    for (const at::Tensor& p : trained().module()->parameters()) {
      if (!p.requires_grad()) tensors.push_back(p);
    }
    return tensors;
  }
};

}  // namespace rlhfd::roles

#include "worker/train/distributed/replicated_model.h"

#include <ATen/ATen.h>

#include "common/status/status_macros.h"

namespace rlhfd::train {

absl::Status ReduceDoubles(parallel::Communicator& group, const at::Device& device,
                           std::vector<double>& values, ReplicaReduce op) {
  if (values.empty() || group.size() == 1) return absl::OkStatus();
  at::Tensor tensor = at::tensor(values, at::kDouble).to(device);
  RETURN_IF_ERROR(group.AllReduce(
      tensor, op == ReplicaReduce::kSum ? parallel::ReduceOp::kSum : parallel::ReduceOp::kMax));
  const at::Tensor host = tensor.cpu();
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = host[static_cast<int64_t>(i)].item<double>();
  return absl::OkStatus();
}

ReplicatedModel::ReplicatedModel(model::Transformer module, parallel::Communicator& group,
                                 AdamWOptions options)
    : module_(std::move(module)),
      group_(group),
      optimizer_(model::TrainableParameters(module_), group, options) {}

absl::StatusOr<double> ReplicatedModel::FinishStep(double lr, double max_norm) {
  absl::StatusOr<double> norm = optimizer_.Step(lr, max_norm);
  if (!norm.ok()) ZeroGrad();
  return norm;
}

void ReplicatedModel::ZeroGrad() {
  for (at::Tensor& p : module_->parameters()) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

absl::Status ReplicatedModel::ReduceOverReplicas(std::vector<double>& values, ReplicaReduce op) {
  const std::vector<at::Tensor> params = module_->parameters();
  return ReduceDoubles(group_, params.empty() ? at::Device(at::kCPU) : params.front().device(),
                       values, op);
}

TrainedModel::NamedTensors ReplicatedModel::StateTensors() {
  NamedTensors state;
  for (const auto& item : module_->named_parameters()) {
    if (item.value().requires_grad()) state.emplace_back(item.key(), item.value());
  }
  for (auto& [name, tensor] : optimizer_.State()) state.emplace_back("optimizer." + name, tensor);
  return state;
}

}  // namespace rlhfd::train

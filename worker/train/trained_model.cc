#include "worker/train/trained_model.h"

#include "worker/train/finite_check.h"

namespace rlhfd::train {

TrainedModel::NamedTensors ModuleAndOptimizerState(model::Transformer& module,
                                                   const AdamW& optimizer) {
  TrainedModel::NamedTensors state;
  for (const auto& item : module->named_parameters()) {
    if (item.value().requires_grad()) state.emplace_back(item.key(), item.value());
  }
  for (auto& [name, tensor] : optimizer.State()) state.emplace_back("optimizer." + name, tensor);
  return state;
}

std::string NonFiniteGradientOrigin(model::Transformer& module) {
  // The backward runs from the output back: a NaN born in layer k spreads to every parameter
  // before it, so the last non-finite gradient in forward order is nearest to where it began.
  std::vector<std::string> names;
  std::vector<at::Tensor> gradients;
  for (const auto& item : module->named_parameters()) {
    names.insert(names.begin(), item.key());
    gradients.insert(gradients.begin(), item.value().grad());
  }
  const std::optional<size_t> found = FirstNonFinite(gradients);
  return found ? names[*found] : "";
}

TrainedModel::OwnedPieces TrainedModel::Pieces() {
  OwnedPieces pieces;
  std::vector<PieceSpan> whole;
  for (const auto& [name, tensor] : model::MergedParameters(module())) {
    whole.push_back({.name = name, .offset = 0, .count = tensor.numel()});
    pieces.values.push_back(tensor.detach().reshape(-1));
  }
  pieces.layout.assign(static_cast<size_t>(replicas()), whole);
  return pieces;
}

absl::StatusOr<std::optional<std::string>> TrainedModel::NonFiniteParameter() {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (const auto& item : module()->named_parameters()) {
    names.push_back(item.key());
    tensors.push_back(item.value());
  }
  const std::optional<size_t> found = FirstNonFinite(tensors);
  if (!found) return std::nullopt;
  return names[*found];
}

}  // namespace rlhfd::train

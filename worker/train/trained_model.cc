#include "worker/train/trained_model.h"

namespace rlhfd::train {

TrainedModel::NamedTensors ModuleAndOptimizerState(model::Transformer& module,
                                                   const AdamW& optimizer) {
  TrainedModel::NamedTensors state;
  for (const auto& item : module->named_parameters()) state.emplace_back(item.key(), item.value());
  for (auto& [name, tensor] : optimizer.State()) state.emplace_back("optimizer." + name, tensor);
  return state;
}

}  // namespace rlhfd::train

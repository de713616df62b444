// Model directory loading.
#include "worker/model/model_loader.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/model/state_dict.h"

namespace rlhfd::model {

void KeepNormWeightsWide(Transformer& model) {
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    at::Tensor& weight = item.value();
    const std::string& name = item.key();
    const bool norm = name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    if (norm && weight.element_size() < 4) weight.set_data(weight.to(at::kFloat));
  }
}

absl::StatusOr<Transformer> LoadModel(const std::string& dir, const LoadOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(StateDict weights, StateDict::Load(dir));
  Transformer model(config);
  model->to(options.device, options.dtype);
  KeepNormWeightsWide(model);
  model->eval();
  if (absl::Status loaded = LoadWeights(model, weights); !loaded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", loaded.message()));
  }
  return model;
}

}  // namespace rlhfd::model

// Model directory loading.
#include "worker/model/model_loader.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/model/state_dict.h"

namespace rlhfd::model {

absl::StatusOr<Transformer> LoadModel(const std::string& dir, const LoadOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(StateDict weights, StateDict::Load(dir));
  Transformer model(config);
  model->to(options.device, options.dtype);
  model->eval();
  if (absl::Status loaded = LoadWeights(model, weights); !loaded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", loaded.message()));
  }
  return model;
}

}  // namespace rlhfd::model

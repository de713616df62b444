// Model directory loading.
#include "worker/model/model_loader.h"

#include <ATen/ATen.h>

#include <set>

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
  const bool fresh_head = options.fresh_score_head && options.head == HeadNeed::kScore &&
                          config.head == HeadKind::kCausalLm;
  if (fresh_head) {
    config.head = HeadKind::kTokenScore;
    config.num_labels = 1;
    config.architecture += " (decoder) with a new value head";
  }
  const bool causal = config.head == HeadKind::kCausalLm;
  if ((options.head == HeadNeed::kCausalLm && !causal) ||
      (options.head == HeadNeed::kScore && causal)) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": ", config.architecture, " has ", causal ? "a language-model head" : "a score head",
        "; this role needs ",
        options.head == HeadNeed::kCausalLm ? "a *ForCausalLM model"
                                            : "a *ForSequenceClassification or "
                                              "*ForTokenClassification model (num_labels: 1)"));
  }
  if (options.head == HeadNeed::kScore && config.num_labels != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": num_labels is ", config.num_labels, "; a value or reward head has 1"));
  }
  if (options.max_sequence_length == 0 && config.sliding_window > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": the model uses sliding-window attention (window ", config.sliding_window,
        " tokens); say how long its sequences get so rlhfd can check they fit in the window"));
  }
  if (absl::Status fits = options.max_sequence_length == LoadOptions::kNoForward
                              ? absl::OkStatus()
                              : CheckSequenceFits(config, options.max_sequence_length,
                                                  options.sequence_what);
      !fits.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", fits.message()));
  }
  ASSIGN_OR_RETURN(StateDict weights, StateDict::Load(dir));
  try {
    Transformer model(config);
    model->to(options.device, options.dtype);
    KeepNormWeightsWide(model);
    model->eval();
    std::set<std::string> fresh, ignored;
    if (fresh_head) {
      at::NoGradGuard no_grad;
      const at::Generator generator = at::detail::createCPUGenerator(options.seed);
      for (auto& item : model->named_parameters()) {
        if (item.key().rfind("score.", 0) != 0) continue;
        fresh.insert(item.key());
        at::Tensor drawn = at::empty(item.value().sizes(), at::kFloat);
        if (item.key() == "score.weight") {
          drawn.normal_(0, config.initializer_range, generator);
        } else {
          drawn.zero_();
        }
        item.value().copy_(drawn);
      }
      ignored = {"lm_head.weight"};
    }
    if (absl::Status loaded = LoadWeights(model, weights, fresh, ignored); !loaded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": ", loaded.message()));
    }
    return model;
  } catch (const std::exception& error) {
    // Allocating the module on the device is where a model too large for it fails.
    return absl::ResourceExhaustedError(absl::StrCat(
        dir, ": cannot build the model on ", options.device.str(), " (",
        std::string(error.what()).substr(0, 300), ")"));
  }
}

}  // namespace rlhfd::model

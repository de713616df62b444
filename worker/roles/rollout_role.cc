#include "worker/roles/rollout_role.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/model/model_config.h"
#include "worker/model/model_loader.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/roles/generated_rows.h"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/training_setup.h"
#include "worker/roles/weight_sync.h"
#include "worker/rollout/tensor_parallel_generation.h"
#include "worker/train/distributed/replicated_model.h"

namespace rlhfd::roles {

RolloutRole::RolloutRole(const v1::JobSpec& spec, const at::Device& device,
                         model::Tokenizer tokenizer, model::ModelConfig config,
                         parallel::Communicator& pool)
    : spec_(spec),
      device_(device),
      tokenizer_(std::move(tokenizer)),
      config_(std::move(config)),
      pool_(pool) {}

absl::StatusOr<std::unique_ptr<RolloutRole>> RolloutRole::Create(const v1::JobSpec& spec,
                                                                 const at::Device& device,
                                                                 const JobLayout& layout,
                                                                 parallel::Communicator& pool,
                                                                 int64_t ranks_on_device) {
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, LoadJobTokenizer(spec));
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> tp_group,
                   SplitRolloutGroup(spec, layout, v1::ROLE_ROLLOUT, pool));
  std::optional<model::Transformer> module;
  model::ModelConfig config;
  if (tp_group) {
    ASSIGN_OR_RETURN(config, model::LoadModelConfig(spec.model().path()));
  } else {
    model::LoadOptions load;
    load.dtype = WeightDtype(spec, device, /*trains=*/false);
    load.device = device;
    load.head = model::HeadNeed::kCausalLm;
    load.max_sequence_length = spec.data().max_prompt_length() + ResponseBudget(spec);
    load.sequence_what = "data.max_prompt_length + the response budget";
    ASSIGN_OR_RETURN(module, model::LoadModel(spec.model().path(), load));
    for (at::Tensor& p : (*module)->parameters()) p.requires_grad_(false);
    (*module)->eval();
    config = (*module)->config();
  }
  RETURN_IF_ERROR(
      model::CheckTokenizerFitsModel(tokenizer, config.vocab_size, spec.model().path()));
  auto role = std::unique_ptr<RolloutRole>(
      new RolloutRole(spec, device, std::move(tokenizer), std::move(config), pool));
  if (module) {
    role->dtypes_ = DtypesOf(*module);
  } else {
    // The slices, as the hybrid engine's from ZeRO-3 shards, all in the rollout's dtype.
    for (const parallel::ShardedParameter& parameter :
         parallel::TensorParallelSpecs(role->config_)) {
      role->dtypes_[parameter.name] = WeightDtype(spec, device, /*trains=*/false);
    }
  }
  role->module_ = std::move(module);
  role->tp_group_ = std::move(tp_group);
  role->engine_options_ = RolloutEngineOptions(role->spec_, role->tp_group_ ? 1 : ranks_on_device);
  return role;
}

absl::StatusOr<std::map<std::string, double>> RolloutRole::ReceiveWeights(
    PoolWeightSync& sync, int64_t step, const RolloutWeightsHook& hook) {
  synced_ = false;
  // The engine reads the weights when it allocates its cache: released, it reads the new ones.
  Release();
  slices_.clear();
  const bool check = WeightSyncCheckDue(spec_, step);
  ASSIGN_OR_RETURN(auto figures,
                   sync.Receive(config_, dtypes_, step, check, hook, module_ ? &*module_ : nullptr,
                                tp_group_.get(), &slices_));
  synced_ = true;
  return figures;
}

absl::StatusOr<std::vector<rollout::GenerationResult>> RolloutRole::Rollout(
    const std::vector<rollout::GenerationRequest>& requests) {
  try {
    at::NoGradGuard no_grad;
    if (tp_group_) {
      ASSIGN_OR_RETURN(rollout::GroupRequests gathered,
                       rollout::GatherGroupRequests(*tp_group_, requests, device_));
      return GenerateOverSlices(config_, slices_, *tp_group_, engine_options_, gathered,
                                requests.size(), &path_logged_, [] {});
    }
    if (!engine_) {
      ASSIGN_OR_RETURN(engine_, rollout::GenerationEngine::Create(*module_, engine_options_));
    }
    return engine_->Generate(requests);
  } catch (const std::exception& error) {
    engine_.reset();
    return absl::InternalError(
        absl::StrCat("generation failed: ", std::string(error.what()).substr(0, 300)));
  }
}

absl::StatusOr<v1::GenerateReply> RolloutRole::Generate(const v1::GenerateRequest& request,
                                                        int64_t total_rows, RowRange rows,
                                                        StepBatch& batch) {
  if (!synced_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generate: step ", request.key().step(),
        ": the rollout pool has not received the actor's weights (SyncWeights first)"));
  }
  RowsGenerator generator{
      .spec = spec_,
      .tokenizer = tokenizer_,
      .device = device_,
      .tools = {},
      .rollout = [this](const std::vector<rollout::GenerationRequest>& requests, int64_t,
                        google::protobuf::Map<std::string, double>&) { return Rollout(requests); },
      .weights_update_s = [] { return 0.0; },
      .release_cache = [this] { Release(); },
      .reduce_longest =
          [this](std::vector<double>& longest) {
            return train::ReduceDoubles(pool_, device_, longest, train::ReplicaReduce::kMax);
          },
  };
  return GenerateRows(generator, request, total_rows, rows, batch);
}

}  // namespace rlhfd::roles

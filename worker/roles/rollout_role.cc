#include "worker/roles/rollout_role.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/model/model_loader.h"
#include "worker/roles/generated_rows.h"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/training_setup.h"
#include "worker/roles/weight_sync.h"
#include "worker/train/distributed/replicated_model.h"

namespace rlhfd::roles {

RolloutRole::RolloutRole(const v1::JobSpec& spec, const at::Device& device,
                         model::Tokenizer tokenizer, model::Transformer module,
                         parallel::Communicator& pool)
    : spec_(spec),
      device_(device),
      tokenizer_(std::move(tokenizer)),
      module_(std::move(module)),
      pool_(pool) {}

absl::StatusOr<std::unique_ptr<RolloutRole>> RolloutRole::Create(const v1::JobSpec& spec,
                                                                 const at::Device& device,
                                                                 parallel::Communicator& pool,
                                                                 int64_t ranks_on_device) {
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, LoadJobTokenizer(spec));
  model::LoadOptions load;
  load.dtype = WeightDtype(spec, device, /*trains=*/false);
  load.device = device;
  load.head = model::HeadNeed::kCausalLm;
  load.max_sequence_length = spec.data().max_prompt_length() + ResponseBudget(spec);
  load.sequence_what = "data.max_prompt_length + the response budget";
  ASSIGN_OR_RETURN(model::Transformer module, model::LoadModel(spec.model().path(), load));
  RETURN_IF_ERROR(
      model::CheckTokenizerFitsModel(tokenizer, module->config().vocab_size, spec.model().path()));
  for (at::Tensor& p : module->parameters()) p.requires_grad_(false);
  module->eval();
  auto role = std::unique_ptr<RolloutRole>(
      new RolloutRole(spec, device, std::move(tokenizer), std::move(module), pool));
  role->engine_options_ = RolloutEngineOptions(role->spec_, ranks_on_device);
  return role;
}

absl::StatusOr<std::map<std::string, double>> RolloutRole::ReceiveWeights(
    PoolWeightSync& sync, int64_t step, const RolloutWeightsHook& hook) {
  synced_ = false;
  // The engine reads the weights when it allocates its cache: released, it reads the new ones.
  Release();
  const bool check = WeightSyncCheckDue(spec_, step);
  ASSIGN_OR_RETURN(auto figures, sync.Receive(module_, step, check, hook));
  synced_ = true;
  return figures;
}

absl::StatusOr<v1::GenerateReply> RolloutRole::Generate(const v1::GenerateRequest& request,
                                                        int64_t total_rows, RowRange rows,
                                                        StepBatch& batch) {
  if (!synced_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generate: step ", request.key().step(),
        ": the rollout pool has not received the actor's weights (SyncWeights first)"));
  }
  if (!engine_) {
    ASSIGN_OR_RETURN(engine_, rollout::GenerationEngine::Create(module_, engine_options_));
  }
  RowsGenerator generator{
      .spec = spec_,
      .tokenizer = tokenizer_,
      .device = device_,
      .tools = {},
      .rollout = [this](const std::vector<rollout::GenerationRequest>& requests, int64_t,
                        google::protobuf::Map<std::string, double>&)
          -> absl::StatusOr<std::vector<rollout::GenerationResult>> {
        try {
          at::NoGradGuard no_grad;
          return engine_->Generate(requests);
        } catch (const std::exception& error) {
          engine_.reset();
          return absl::InternalError(
              absl::StrCat("generation failed: ", std::string(error.what()).substr(0, 300)));
        }
      },
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

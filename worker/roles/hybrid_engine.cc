#include "worker/roles/hybrid_engine.h"

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/stopwatch.h"
#include "worker/model/model_loader.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/training_setup.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/tensor_parallel_generation.h"
#include "worker/train/distributed/fully_sharded.h"

namespace rlhfd::roles {
absl::StatusOr<std::unique_ptr<parallel::Communicator>> SplitRolloutGroup(
    const v1::JobSpec& spec, const at::Device& device, const JobLayout& layout,
    parallel::Communicator& pool) {
  const int tp = spec.roles().actor().rollout().tp();
  if (tp <= 1) return std::unique_ptr<parallel::Communicator>();
  if (device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("roles.actor.rollout.tp ", tp, " runs on CPU workers only (yet)"));
  }
  const auto place = layout.TensorParallelPlaceIn(v1::ROLE_ACTOR, tp);
  if (!place.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("roles.actor.rollout.tp: ", place.status().message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> group,
                   pool.Split(place->group, place->slice));
  RLOG(INFO) << "actor rank " << pool.rank() << ": rollout as slice " << place->slice
             << " of tensor-parallel group " << place->group << " (tp " << tp << ")";
  return group;
}

HybridEngine::HybridEngine(const v1::JobSpec& spec, const at::Device& device,
                           parallel::Communicator& pool, train::TrainedModel& trained,
                           std::unique_ptr<parallel::Communicator> tp_group,
                           RolloutWeightsHook hook)
    : spec_(spec),
      device_(device),
      pool_(pool),
      trained_(trained),
      tp_group_(std::move(tp_group)),
      hook_(std::move(hook)) {}

absl::StatusOr<model::Transformer> HybridEngine::WeightsIn(at::ScalarType dtype) {
  model::Transformer& trained = trained_.module();
  auto* sharded = dynamic_cast<train::FullyShardedModel*>(&trained_);
  if (sharded == nullptr && dtype == at::kFloat) return trained;
  // The layout shards the weights, or they are wanted in a narrower dtype: a copy.
  std::vector<at::Tensor> full;
  if (sharded != nullptr) {
    ASSIGN_OR_RETURN(full, sharded->FullParameters());
  } else {
    full = trained->parameters();
  }
  try {
    at::NoGradGuard no_grad;
    if (!copy_ || copy_dtype_ != dtype) {
      // The module is built once (on the CPU, where its constructor initialises it); later
      // copies only allocate its storage again (ReleaseCopy frees it).
      model::Transformer copy(trained->config());
      copy->to(device_, dtype);
      model::KeepNormWeightsWide(copy);
      copy->eval();
      copy_ = copy;
      copy_dtype_ = dtype;
      copy_shapes_.clear();
      for (const at::Tensor& p : copy->parameters()) {
        copy_shapes_.emplace_back(p.sizes().vec(), p.scalar_type());
      }
    }
    std::vector<at::Tensor> params = (*copy_)->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].numel() == 0 && !copy_shapes_[i].first.empty()) {
        params[i].set_data(
            at::empty(copy_shapes_[i].first,
                      at::TensorOptions().dtype(copy_shapes_[i].second).device(device_)));
      }
      params[i].copy_(full[i]);
    }
    copy_held_ = true;
    return *copy_;
  } catch (const std::exception& error) {
    ReleaseCopy();
    return absl::ResourceExhaustedError(absl::StrCat("a copy of the actor's weights does not fit: ",
                                                     std::string(error.what()).substr(0, 300)));
  }
}

void HybridEngine::ReleaseCopy() {
  if (!copy_ || !copy_held_) return;
  at::NoGradGuard no_grad;
  for (at::Tensor& p : (*copy_)->parameters()) {
    p.set_data(at::empty({0}, p.options()));
  }
  copy_held_ = false;
}

absl::StatusOr<model::Transformer> HybridEngine::RolloutWeights(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  last_check_.reset();
  ASSIGN_OR_RETURN(model::Transformer weights,
                   WeightsIn(WeightDtype(spec_, device_, /*trains=*/false)));
  if (hook_) hook_(weights, pool_.rank());
  rollout::Synchronize(device_);
  weights_update_s_ = SecondsSince(start);
  if (WeightSyncCheckDue(spec_, step)) {
    absl::StatusOr<WeightSyncCheck> check =
        VerifyRolloutWeights(trained_, weights, pool_, device_, step);
    if (!check.ok()) {
      ReleaseCopy();
      return check.status();
    }
    last_check_ = *check;
  }
  return weights;
}

absl::StatusOr<double> HybridEngine::TrainedWeightsChecksum() {
  // The rollout holds the copy's dtypes when it needs a copy, else the training module's own.
  const bool copies = copy_.has_value() && copy_dtype_ == WeightDtype(spec_, device_, false);
  return roles::TrainedWeightsChecksum(trained_, DtypesOf(copies ? *copy_ : trained_.module()),
                                       pool_, device_);
}

absl::StatusOr<rollout::GenerationEngine*> HybridEngine::Engine(int64_t step) {
  // The engine reads the weights when it allocates its cache (after Release), so the copy is
  // refreshed first; the engine itself (over the same module) lives from step to step.
  ASSIGN_OR_RETURN(model::Transformer rollout_model, RolloutWeights(step));
  if (engine_) return engine_.get();
  const v1::RolloutSpec& rollout = spec_.roles().actor().rollout();
  rollout::EngineOptions options;
  options.max_num_seqs = rollout.max_num_seqs();
  options.max_model_len = spec_.data().max_prompt_length() + ResponseBudget(spec_);
  options.gpu_memory_utilization = rollout.gpu_memory_utilization();
  options.seed = static_cast<uint64_t>(spec_.trainer().seed());
  ASSIGN_OR_RETURN(engine_, rollout::GenerationEngine::Create(rollout_model, options));
  return engine_.get();
}

void HybridEngine::ReleaseCache() {
  if (engine_) engine_->Release();
}

void HybridEngine::Release() {
  if (engine_) engine_->Release();
  tensor_parallel_.reset();
  ReleaseCopy();
}

absl::StatusOr<std::vector<rollout::GenerationResult>> HybridEngine::GenerateTensorParallel(
    const std::vector<rollout::GenerationRequest>& requests, int64_t step) {
  parallel::Communicator& group = *tp_group_;
  ASSIGN_OR_RETURN(rollout::GroupRequests gathered, rollout::GatherGroupRequests(group, requests));

  // This rank's slices, cut from the current weights (views where a slice is a run of them).
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(model::Transformer weights, RolloutWeights(step));
  const model::ModelConfig& config = weights->config();
  const int tp = group.size();
  const parallel::RolloutLayout layout{.tp = tp, .dp = pool_.size() / tp};
  auto named = weights->named_parameters();
  std::map<std::string, at::Tensor> slices;
  for (const parallel::ShardedParameter& parameter : parallel::TensorParallelSpecs(config)) {
    slices[parameter.name] =
        parallel::RolloutSlice(named[parameter.name].detach(), parameter, layout, pool_.rank());
  }
  ASSIGN_OR_RETURN(parallel::TensorParallelTransformer model,
                   parallel::TensorParallelTransformer::Create(config, std::move(slices), group));
  tensor_parallel_.emplace(std::move(model));
  weights_update_s_ = SecondsSince(start) - (last_check_ ? last_check_->seconds : 0.0);
  ASSIGN_OR_RETURN(std::vector<rollout::GenerationResult> results,
                   rollout::GenerateTensorParallel(*tensor_parallel_, gathered.all,
                                                   config.eos_token_ids, config.vocab_size));
  tensor_parallel_.reset();
  ReleaseCopy();
  const auto first = results.begin() + static_cast<std::ptrdiff_t>(gathered.first);
  return std::vector<rollout::GenerationResult>(
      std::make_move_iterator(first),
      std::make_move_iterator(first + static_cast<std::ptrdiff_t>(requests.size())));
}

absl::StatusOr<std::vector<rollout::GenerationResult>> HybridEngine::Generate(
    const std::vector<rollout::GenerationRequest>& requests, int64_t step) {
  if (tp_group_) {
    try {
      return GenerateTensorParallel(requests, step);
    } catch (const std::exception& error) {
      Release();
      return absl::InternalError(absl::StrCat("tensor-parallel generation failed: ",
                                              std::string(error.what()).substr(0, 300)));
    }
  }
  ASSIGN_OR_RETURN(rollout::GenerationEngine * engine, Engine(step));
  try {
    at::NoGradGuard no_grad;
    return engine->Generate(requests);
  } catch (const std::exception& error) {
    Release();
    engine_.reset();
    return absl::InternalError(
        absl::StrCat("generation failed: ", std::string(error.what()).substr(0, 300)));
  }
}

}  // namespace rlhfd::roles

#include "worker/roles/hybrid_engine.h"

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/stages/role_names.h"
#include "common/status/status_macros.h"
#include "common/util/stopwatch.h"
#include "worker/model/lora.h"
#include "worker/model/model_loader.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/training_setup.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/tensor_parallel_generation.h"
#include "worker/train/distributed/fully_sharded.h"
#include "worker/train/distributed/replicated_model.h"

namespace rlhfd::roles {
absl::StatusOr<std::unique_ptr<parallel::Communicator>> SplitRolloutGroup(
    const v1::JobSpec& spec, const JobLayout& layout, v1::Role role, parallel::Communicator& pool) {
  const int tp = spec.roles().actor().rollout().tp();
  if (tp <= 1) return std::unique_ptr<parallel::Communicator>();
  const auto place = layout.TensorParallelPlaceIn(role, tp);
  if (!place.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("roles.actor.rollout.tp: ", place.status().message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> group,
                   pool.Split(place->group, place->slice));
  RLOG(INFO) << stages::RoleName(role) << " rank " << pool.rank() << ": rollout as slice "
             << place->slice << " of tensor-parallel group " << place->group << " (tp " << tp
             << ")";
  return group;
}

HybridEngine::HybridEngine(const v1::JobSpec& spec, const at::Device& device,
                           parallel::Communicator& pool, train::TrainedModel& trained,
                           std::unique_ptr<parallel::Communicator> tp_group,
                           int64_t ranks_on_device, RolloutWeightsHook hook)
    : spec_(spec),
      device_(device),
      pool_(pool),
      trained_(trained),
      ranks_on_device_(std::max<int64_t>(1, ranks_on_device)),
      tp_group_(std::move(tp_group)),
      hook_(std::move(hook)) {}

absl::StatusOr<model::Transformer> HybridEngine::WeightsIn(at::ScalarType dtype) {
  model::Transformer& trained = trained_.module();
  auto* sharded = dynamic_cast<train::FullyShardedModel*>(&trained_);
  const bool adapted = model::HasLoraAdapters(trained);
  if (sharded == nullptr && !adapted && dtype == at::kFloat) return trained;
  // The layout shards the weights, they carry LoRA adapters (the rollout runs them merged), or
  // they are wanted in a narrower dtype: a copy.
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
  } catch (const std::exception& error) {
    return absl::ResourceExhaustedError(absl::StrCat("a copy of the actor's weights does not fit: ",
                                                     std::string(error.what()).substr(0, 300)));
  }
  std::vector<at::Tensor> full;
  if (sharded != nullptr && !adapted && !tp_group_ && (!reshard_ || reshard_dtype_ == dtype)) {
    // ZeRO-3 at rollout tp 1: every rank's copy comes straight from the shards that hold each
    // part, cast to the copy's dtypes on the way, in buckets (the reshard at layout (tp 1, dp)):
    // no rank gathers the weights in the training dtype first.
    const auto named = (*copy_)->named_parameters();
    const std::vector<parallel::ShardedParameter> specs =
        parallel::TensorParallelSpecs(trained->config());
    std::vector<at::ScalarType> dtypes;
    for (const parallel::ShardedParameter& parameter : specs) {
      const at::Tensor* held = named.find(parameter.name);
      if (held == nullptr) {
        return absl::InternalError(
            absl::StrCat("reshard: the rollout's copy has no ", parameter.name));
      }
      dtypes.push_back(held->scalar_type());
    }
    ASSIGN_OR_RETURN(const auto whole, Reshard(specs, {.tp = 1, .dp = pool_.size()}, dtypes));
    reshard_dtype_ = dtype;
    for (size_t i = 0; i < named.size(); ++i) {
      const auto found = whole.find(named[i].key());
      if (found == whole.end()) {
        return absl::InternalError(
            absl::StrCat("reshard: no part of ", named[i].key(), " arrived"));
      }
      full.push_back(found->second.view(copy_shapes_[i].first));
    }
  } else if (sharded != nullptr) {
    ASSIGN_OR_RETURN(full, sharded->FullParameters());
  } else if (adapted) {
    for (auto& [name, tensor] : model::MergedParameters(trained)) full.push_back(tensor);
  } else {
    full = trained->parameters();
  }
  try {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> params = (*copy_)->parameters();
    // A LoRA model's frozen parameters outside the adapted layers (embeddings, norms, the head,
    // layers not targeted) are already what the rollout needs: the copy holds them by reference,
    // and only the merged layers take new memory.
    std::set<const c10::TensorImpl*> frozen;
    if (adapted) {
      for (const at::Tensor& p : trained->parameters()) {
        if (!p.requires_grad()) frozen.insert(p.unsafeGetTensorImpl());
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (frozen.count(full[i].unsafeGetTensorImpl()) &&
          full[i].scalar_type() == copy_shapes_[i].second && full[i].device() == device_) {
        params[i].set_data(full[i]);
        continue;
      }
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
  ASSIGN_OR_RETURN(model::Transformer weights,
                   WeightsIn(WeightDtype(spec_, device_, /*trains=*/false)));
  if (hook_) {
    std::map<std::string, at::Tensor> named;
    for (const auto& item : weights->named_parameters()) named[item.key()] = item.value();
    hook_(/*resharded=*/false, named, pool_.rank());
  }
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
  ASSIGN_OR_RETURN(engine_,
                   rollout::GenerationEngine::Create(rollout_model, RolloutEngineOptions()));
  return engine_.get();
}

int64_t UpdateBucketBytes(const v1::JobSpec& spec) {
  return int64_t{std::max(1, spec.roles().actor().rollout().update_weights_bucket_megabytes())}
         << 20;
}

rollout::EngineOptions RolloutEngineOptions(const v1::JobSpec& spec, int64_t sharing) {
  const v1::RolloutSpec& rollout = spec.roles().actor().rollout();
  rollout::EngineOptions options;
  options.max_num_seqs = rollout.max_num_seqs();
  options.max_model_len = spec.data().max_prompt_length() + ResponseBudget(spec);
  options.gpu_memory_utilization =
      rollout.gpu_memory_utilization() / static_cast<double>(std::max<int64_t>(1, sharing));
  options.seed = static_cast<uint64_t>(spec.trainer().seed());
  options.enable_prefix_caching = rollout.enable_prefix_caching();
  return options;
}

rollout::EngineOptions HybridEngine::RolloutEngineOptions() const {
  // Ranks on one GPU (workers sharing it) each see the same free memory: each takes its share.
  // A tensor-parallel engine splits among its group's ranks itself (GenerationEngine::Prepare).
  return roles::RolloutEngineOptions(spec_, tp_group_ ? 1 : ranks_on_device_);
}

void HybridEngine::ReleaseCache() {
  if (engine_) engine_->Release();
}

void HybridEngine::Release() {
  if (engine_) engine_->Release();
  ReleaseCopy();
}

absl::StatusOr<std::map<std::string, at::Tensor>> HybridEngine::TensorParallelSlices(int64_t step) {
  const model::ModelConfig& config = trained_.module()->config();
  const parallel::RolloutLayout layout{.tp = tp_group_->size(),
                                       .dp = pool_.size() / tp_group_->size()};
  const std::vector<parallel::ShardedParameter> specs = parallel::TensorParallelSpecs(config);
  auto* sharded = dynamic_cast<train::FullyShardedModel*>(&trained_);
  const at::ScalarType dtype = WeightDtype(spec_, device_, /*trains=*/false);
  std::map<std::string, at::Tensor> resharded;
  if (sharded != nullptr && dtype == sharded->module()->parameters()[0].scalar_type()) {
    // ZeRO-3: each rank receives only its own slices, straight from the shards that hold them
    // (the 3D-HybridEngine's reshard): no rank gathers the whole model.
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(resharded,
                     Reshard(specs, layout, std::vector<at::ScalarType>(specs.size(), dtype)));
    reshard_s_ = SecondsSince(start);
    if (hook_) hook_(/*resharded=*/true, resharded, pool_.rank());
    if (!WeightSyncCheckDue(spec_, step)) return resharded;
  }
  // The slices of the current weights (views where a slice is a run of them); a checked step
  // under ZeRO-3 gathers them too (checked against the trained shards) and holds the resharded
  // slices to them, bitwise.
  ASSIGN_OR_RETURN(model::Transformer weights, RolloutWeights(step));
  auto named = weights->named_parameters();
  std::map<std::string, at::Tensor> slices;
  for (const parallel::ShardedParameter& parameter : specs) {
    slices[parameter.name] =
        parallel::RolloutSlice(named[parameter.name].detach(), parameter, layout, pool_.rank());
  }
  if (resharded.empty()) return slices;
  // The first differing slice (its index + 1; -1: this rank could not compare), shared so that
  // every rank fails together.
  double differing = 0;
  try {
    for (size_t i = 0; i < specs.size() && differing == 0; ++i) {
      if (!at::equal(resharded.at(specs[i].name), slices.at(specs[i].name))) {
        differing = static_cast<double>(i + 1);
      }
    }
  } catch (const std::exception& error) {
    RLOG(WARNING) << "comparing the resharded slices: " << error.what();
    differing = -1;
  }
  std::vector<double> found(static_cast<size_t>(pool_.size()), -2.0);
  found[pool_.rank()] = differing;
  RETURN_IF_ERROR(train::ReduceDoubles(pool_, device_, found, train::ReplicaReduce::kMax));
  ReleaseCopy();
  for (int rank = 0; rank < pool_.size(); ++rank) {
    if (found[rank] == -1) {
      return absl::InternalError(absl::StrCat("trainer.verify_weight_sync: step ", step,
                                              ": actor rank ", rank,
                                              " could not compare its resharded slices (its log "
                                              "says why)"));
    }
    if (found[rank] > 0) {
      return absl::DataLossError(absl::StrCat("trainer.verify_weight_sync: step ", step,
                                              ": actor rank ", rank, "'s resharded slice of ",
                                              specs[static_cast<size_t>(found[rank]) - 1].name,
                                              " differs from the slice of the gathered weights"));
    }
  }
  return resharded;
}

absl::StatusOr<std::map<std::string, at::Tensor>> HybridEngine::Reshard(
    const std::vector<parallel::ShardedParameter>& specs, const parallel::RolloutLayout& layout,
    const std::vector<at::ScalarType>& dtypes) {
  // Which part of each parameter each rank's shards hold, and this rank's parts.
  const train::FullyShardedModel::PartsByParameter parts =
      dynamic_cast<train::FullyShardedModel&>(trained_).PartsOfParameters();
  std::vector<parallel::ShardedParameter> sharded = specs;
  std::vector<at::Tensor> shards;
  for (parallel::ShardedParameter& parameter : sharded) {
    const auto found = parts.ranges.find(parameter.name);
    if (found == parts.ranges.end()) {
      return absl::InternalError(
          absl::StrCat("reshard: no rank's ZeRO-3 shards hold ", parameter.name));
    }
    parameter.train_ranges = found->second;
    const auto own = parts.mine.find(parameter.name);
    shards.push_back(
        own != parts.mine.end()
            ? own->second.contiguous()
            : at::empty({0}, at::TensorOptions(dtypes[shards.size()]).device(device_)));
  }
  if (!reshard_) {
    ASSIGN_OR_RETURN(
        parallel::ReshardPlan plan,
        parallel::ReshardPlan::Create(pool_, sharded, dtypes, {.dp = pool_.size(), .tp = 1}, layout,
                                      device_, {.bucket_bytes = UpdateBucketBytes(spec_)}));
    reshard_.emplace(std::move(plan));
  }
  ASSIGN_OR_RETURN(std::vector<at::Tensor> slices, reshard_->Run(pool_, shards));
  std::map<std::string, at::Tensor> named;
  for (size_t i = 0; i < sharded.size(); ++i) named[sharded[i].name] = std::move(slices[i]);
  return named;
}

absl::StatusOr<std::vector<rollout::GenerationResult>> GenerateCountingPreemptions(
    rollout::GenerationEngine& engine, const std::vector<rollout::GenerationRequest>& requests,
    rollout::TurnHandler* turns, const std::atomic<int64_t>* interrupt, int64_t& preemptions) {
  const int64_t before = engine.stats().preemptions;
  auto results = engine.Generate(requests, turns, interrupt);
  const int64_t preempted = engine.stats().preemptions - before;
  preemptions += preempted;
  if (preempted > 0) {
    // As vLLM warns: the results are the same, the recomputation costs time.
    RLOG(WARNING) << "rollout: " << preempted
                  << " sequences gave their KV cache blocks up mid-generation and were "
                     "prefilled again; raise roles.actor.rollout.gpu_memory_utilization or "
                     "lower roles.actor.rollout.max_num_seqs";
  }
  return results;
}

absl::StatusOr<std::vector<rollout::GenerationResult>> GenerateOverSlices(
    const model::ModelConfig& config, std::map<std::string, at::Tensor> slices,
    parallel::Communicator& group, const rollout::EngineOptions& options,
    const rollout::GroupRequests& gathered, size_t count, bool* path_logged,
    const std::function<void()>& ready, int64_t& preemptions) {
  absl::StatusOr<std::vector<rollout::GenerationResult>> results;
  const auto embed = slices.find("model.embed_tokens.weight");
  const bool fused =
      embed != slices.end() && rollout::FusedDecoder::Supports(config, embed->second, group.size());
  if (!*path_logged) {
    RLOG(INFO) << "rollout tp " << group.size() << ", slice " << group.rank() << ": "
               << (fused ? "the fused GPU decode with a KV cache of this rank's heads"
                         : "a forward over the whole prefixes per token (no KV cache)");
    *path_logged = true;
  }
  if (fused) {
    // The fused decode over the slices, with a KV cache (sliced to this rank's heads).
    ASSIGN_OR_RETURN(
        std::unique_ptr<rollout::GenerationEngine> engine,
        rollout::GenerationEngine::CreateTensorParallel(config, std::move(slices), group, options));
    ready();
    at::NoGradGuard no_grad;
    results = GenerateCountingPreemptions(*engine, gathered.all, nullptr, nullptr, preemptions);
    engine->Release();
  } else {
    ASSIGN_OR_RETURN(parallel::TensorParallelTransformer model,
                     parallel::TensorParallelTransformer::Create(config, std::move(slices), group));
    ready();
    results = rollout::GenerateTensorParallel(model, gathered.all, config.eos_token_ids,
                                              config.vocab_size);
  }
  if (!results.ok()) return results.status();
  const auto first = results->begin() + static_cast<std::ptrdiff_t>(gathered.first);
  return std::vector<rollout::GenerationResult>(
      std::make_move_iterator(first),
      std::make_move_iterator(first + static_cast<std::ptrdiff_t>(count)));
}

absl::StatusOr<std::vector<rollout::GenerationResult>> HybridEngine::GenerateTensorParallel(
    const std::vector<rollout::GenerationRequest>& requests, int64_t step) {
  parallel::Communicator& group = *tp_group_;
  ASSIGN_OR_RETURN(rollout::GroupRequests gathered,
                   rollout::GatherGroupRequests(group, requests, device_));

  const auto start = std::chrono::steady_clock::now();
  using Slices = std::map<std::string, at::Tensor>;
  ASSIGN_OR_RETURN(Slices slices, TensorParallelSlices(step));
  // Resharded: the reshard alone (a checked step's gather is the check's cost); else the cut
  // from the weights brought up to date.
  const auto updated = [&] {
    weights_update_s_ = reshard_s_ >= 0
                            ? reshard_s_
                            : SecondsSince(start) - (last_check_ ? last_check_->seconds : 0.0);
  };
  absl::StatusOr<std::vector<rollout::GenerationResult>> results = GenerateOverSlices(
      trained_.module()->config(), std::move(slices), group, RolloutEngineOptions(), gathered,
      requests.size(), &path_logged_, updated, preemptions_);
  ReleaseCopy();
  return results;
}

absl::StatusOr<std::vector<rollout::GenerationResult>> HybridEngine::Generate(
    const std::vector<rollout::GenerationRequest>& requests, int64_t step,
    rollout::TurnHandler* turns) {
  last_check_.reset();
  reshard_s_ = -1;
  weights_update_s_ = 0;  // a step whose weights are current updates nothing
  preemptions_ = 0;
  if (tp_group_) {
    if (turns != nullptr) {
      return absl::InvalidArgumentError("multi-turn rollouts run at rollout tp 1 for now");
    }
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
    auto results = GenerateCountingPreemptions(*engine, requests, turns, nullptr, preemptions_);
    if (results.ok() && device_.is_cuda() && !cache_logged_) {
      cache_logged_ = true;
      const rollout::EngineOptions& options = engine->options();
      RLOG(INFO) << "rollout KV cache: " << engine->stats().cache_blocks << " blocks of "
                 << options.kv_block_size << " positions, "
                 << engine->stats().cache_bytes / (1 << 20) << " MiB (gpu_memory_utilization "
                 << options.gpu_memory_utilization * static_cast<double>(ranks_on_device_)
                 << " of the free memory, split among the " << ranks_on_device_
                 << " of the job's ranks on this GPU)";
    }
    return results;
  } catch (const std::exception& error) {
    Release();
    engine_.reset();
    return absl::InternalError(
        absl::StrCat("generation failed: ", std::string(error.what()).substr(0, 300)));
  }
}

}  // namespace rlhfd::roles

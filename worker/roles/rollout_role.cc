#include "worker/roles/rollout_role.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/stopwatch.h"
#include "worker/model/model_config.h"
#include "worker/model/model_loader.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/roles/generated_rows.h"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/training_setup.h"
#include "worker/roles/weight_sync.h"
#include "worker/rollout/sampling_math.h"
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

absl::StatusOr<std::unique_ptr<RolloutRole>> RolloutRole::Create(
    const v1::JobSpec& spec, const at::Device& device, const JobLayout& layout,
    parallel::Communicator& pool, int64_t ranks_on_device, absl::Duration decode_step_hold) {
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
  role->engine_options_.decode_step_hold = absl::ToChronoMilliseconds(decode_step_hold);
  return role;
}

absl::StatusOr<std::map<std::string, double>> RolloutRole::ReceiveWeights(
    PoolWeightSync& sync, int64_t step, int64_t weights_step, const RolloutWeightsHook& hook) {
  synced_ = false;
  weights_step_ = weights_step;
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
    const std::vector<rollout::GenerationRequest>& requests, int64_t& preemptions,
    const std::atomic<int64_t>* interrupt) {
  try {
    at::NoGradGuard no_grad;
    if (tp_group_) {
      ASSIGN_OR_RETURN(rollout::GroupRequests gathered,
                       rollout::GatherGroupRequests(*tp_group_, requests, device_));
      return GenerateOverSlices(
          config_, slices_, *tp_group_, engine_options_, gathered, requests.size(), &path_logged_,
          [] {}, preemptions);
    }
    if (!engine_) {
      ASSIGN_OR_RETURN(engine_, rollout::GenerationEngine::Create(*module_, engine_options_));
    }
    return GenerateCountingPreemptions(*engine_, requests, nullptr, interrupt, preemptions);
  } catch (const std::exception& error) {
    engine_.reset();
    return absl::InternalError(
        absl::StrCat("generation failed: ", std::string(error.what()).substr(0, 300)));
  }
}

RowsGenerator RolloutRole::Generator() {
  return RowsGenerator{
      .spec = spec_,
      .tokenizer = tokenizer_,
      .device = device_,
      .tools = {},
      .rollout =
          [this](const std::vector<rollout::GenerationRequest>& requests, int64_t,
                 google::protobuf::Map<std::string, double>& metrics) {
            int64_t preemptions = 0;
            auto results = Rollout(requests, preemptions);
            metrics["preemptions"] = static_cast<double>(preemptions);
            return results;
          },
      .weights_update_s = [] { return 0.0; },
      .release_cache = [this] { Release(); },
      .reduce_longest =
          [this](std::vector<double>& longest) {
            return train::ReduceDoubles(pool_, device_, longest, train::ReplicaReduce::kMax);
          },
  };
}

absl::StatusOr<v1::GenerateReply> RolloutRole::Generate(
    const v1::GenerateRequest& request, int64_t total_rows, RowRange rows, StepBatch& batch,
    const std::atomic<int64_t>* queued_pool_calls) {
  if (!synced_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generate: step ", request.key().step(),
        ": the rollout pool has not received the actor's weights (SyncWeights first)"));
  }
  if (engine_options_.decode_step_hold.count() > 0) {
    // Drills and tests wait for this line to act while a generation is in hand.
    RLOG(INFO) << "step " << request.key().step() << ": generating, each decode step held "
               << engine_options_.decode_step_hold.count() << " ms (a fault drill)";
  }
  if (spec_.trainer().mode() == v1::TRAINER_MODE_ASYNC) {
    const bool partial = spec_.roles().rollout().partial_rollout();
    return GenerateInParts(request, total_rows, rows, batch, partial ? queued_pool_calls : nullptr);
  }
  return GenerateRows(Generator(), request, total_rows, rows, batch);
}

absl::StatusOr<v1::GenerateReply> RolloutRole::GenerateInParts(
    const v1::GenerateRequest& request, int64_t total_rows, RowRange rows, StepBatch& batch,
    const std::atomic<int64_t>* interrupt) {
  const auto start = std::chrono::steady_clock::now();
  const RowsGenerator generator = Generator();
  const int64_t step = request.key().step();
  const int64_t n = spec_.roles().actor().rollout().n();
  if (request.resume()) {
    if (!partial_ || partial_->request.key().step() != step) {
      return absl::FailedPreconditionError(
          absl::StrCat("generate: step ", step,
                       ": nothing to resume (no rollout of the step was interrupted "
                       "on this rank)"));
    }
  } else {
    RETURN_IF_ERROR(CheckShare(spec_, request, total_rows, rows));
    ASSIGN_OR_RETURN(PromptRequests encoded, EncodeShare(generator, request));
    const size_t prompts = encoded.requests.size();
    partial_.emplace(PartialRollout{
        .request = request,
        .encoded = std::move(encoded),
        .results = std::vector<rollout::GenerationResult>(prompts),
        .weights_steps = TokenWeightsSteps(prompts, std::vector<std::vector<float>>(n))});
    for (rollout::GenerationResult& result : partial_->results) {
      result.samples.assign(
          n, rollout::Completion{.finish_reason = rollout::FinishReason::kInterrupted});
    }
  }
  PartialRollout& part = *partial_;
  // What goes on: a prompt none of whose responses began, whole (its n responses share the
  // prefill); each other unfinished response from where it stopped, as its own request.
  std::vector<rollout::GenerationRequest> requests;
  std::vector<std::pair<size_t, int64_t>> going_on;  // (prompt, response; -1: all n)
  for (size_t i = 0; i < part.results.size(); ++i) {
    const rollout::GenerationRequest& prompt = part.encoded.requests[i];
    const auto& samples = part.results[i].samples;
    if (std::all_of(samples.begin(), samples.end(), [](const rollout::Completion& sample) {
          return sample.finish_reason == rollout::FinishReason::kInterrupted &&
                 sample.token_ids.empty();
        })) {
      requests.push_back(prompt);
      going_on.emplace_back(i, -1);
      continue;
    }
    for (int64_t j = 0; j < n; ++j) {
      if (samples[j].finish_reason != rollout::FinishReason::kInterrupted) continue;
      rollout::GenerationRequest resumed = prompt;
      resumed.sampling.n = 1;
      resumed.sampling.seed = rollout::SampleSeed(*prompt.sampling.seed, static_cast<uint64_t>(j));
      resumed.resumed = samples[j];
      requests.push_back(std::move(resumed));
      going_on.emplace_back(i, j);
    }
  }
  std::vector<rollout::GenerationResult> results;
  if (!requests.empty()) {
    ASSIGN_OR_RETURN(results, Rollout(requests, part.preemptions, interrupt));
  }
  double unfinished = 0;
  for (size_t k = 0; k < going_on.size(); ++k) {
    const auto [i, only] = going_on[k];
    for (int64_t j = only < 0 ? 0 : only; j < (only < 0 ? n : only + 1); ++j) {
      rollout::Completion& sample = part.results[i].samples[j];
      sample = results[k].samples[only < 0 ? j : 0];
      std::vector<float>& steps = part.weights_steps[i][j];
      steps.resize(sample.token_ids.size(), static_cast<float>(weights_step_));
      unfinished += sample.finish_reason == rollout::FinishReason::kInterrupted ? 1 : 0;
    }
  }
  // The pool's ranks lay their rows out together (P and R agreed over it): all go on while any
  // has responses unfinished.
  std::vector<double> pool_unfinished = {unfinished};
  RETURN_IF_ERROR(
      train::ReduceDoubles(pool_, device_, pool_unfinished, train::ReplicaReduce::kSum));
  v1::GenerateReply reply;
  if (pool_unfinished[0] > 0) {
    ++part.interruptions;
    part.generating_s += SecondsSince(start);
    reply.set_unfinished(static_cast<int64_t>(pool_unfinished[0]));
    return reply;
  }
  ASSIGN_OR_RETURN(reply, LayOutRows(generator, part.request, part.encoded, part.results,
                                     &part.weights_steps, total_rows, rows, batch));
  auto& metrics = *reply.mutable_metrics();
  const double seconds = part.generating_s + SecondsSince(start);
  metrics["generate_s"] = seconds;
  metrics["rollout_s"] = seconds;
  metrics["tokens_per_s"] = metrics["response_tokens"] / std::max(seconds, 1e-9);
  metrics["interruptions"] = static_cast<double>(part.interruptions);
  metrics["preemptions"] = static_cast<double>(part.preemptions);
  partial_.reset();
  return reply;
}

}  // namespace rlhfd::roles

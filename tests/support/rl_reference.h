// A single-process computation of one RL step from the engine functions (model forwards,
// estimators, KL, the policy and value updates), independent of worker/roles: what the stage
// tests compare a distributed step's intermediates and weights with.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rlhfd/v1/job_spec.pb.h"
#include "worker/model/transformer.h"
#include "worker/train/trained_model.h"

namespace rlhfd::testing {

// One step's tensors over the whole batch, in the stages' layout (rows × (P + R) sequences,
// rows × R per-token tensors).
struct StepTensors {
  std::map<std::string, at::Tensor> tensors;
  int64_t prompt_length = 0;
};

// Every rank's dump of `step` (DumpBatch files) merged into whole-batch tensors in row order.
StepTensors MergeDumps(const std::vector<std::string>& paths);

struct ReferenceModels {
  model::Transformer actor = nullptr;      // trained in place by ReferenceUpdates
  model::Transformer critic = nullptr;     // may be null (no critic)
  model::Transformer reference = nullptr;  // may be null
  model::Transformer reward = nullptr;     // may be null (rule rewards)
  // The optimisers over actor and critic, kept from step to step.
  std::shared_ptr<train::LocalModel> actor_training, critic_training;
};

// Loads the step's models as the roles do (fp32 CPU; the critic from model.path with a fresh
// value head seeded with trainer.seed).
ReferenceModels LoadReferenceModels(const v1::JobSpec& spec);

// From the generated sequences in `generated` (input_ids, attention_mask, response_mask), the
// step's old/ref log-probs, values, reward-model scores (or `scores` when given), token rewards
// and advantages/returns, as one process computes them.
StepTensors ReferenceForwards(const v1::JobSpec& spec, ReferenceModels& models,
                              const StepTensors& generated, double kl_coef,
                              const at::Tensor& scores = at::Tensor());

// The log-probs `model` gives each response token of `generated` (0 past a response), under the
// rollout's sampling temperature (1 for a greedy rollout), as verl's actor and reference take them.
at::Tensor ResponseLogProbs(const v1::JobSpec& spec, model::Transformer& model,
                            const StepTensors& generated);

// The actor and critic updates of the step over the whole batch in one process (every
// mini-batch the union of the replicas' rows when one mini-batch holds the whole batch).
void ReferenceUpdates(const v1::JobSpec& spec, ReferenceModels& models, const StepTensors& step,
                      int64_t rl_step);

// Largest |a - b| over tensors present in both maps under `names`.
// The parameters a role's checkpoint holds (`role_dir`: <checkpoint_dir>/step_<N>/<role>), by
// name, for a model of `like`'s architecture: read whole from rank_0 (one process, ZeRO-2), or
// put together from every rank's ZeRO-3 unit shards. That layout is written out here, apart from
// the product's: a unit is each decoder layer's parameters, then one of all the others, each
// flattened and concatenated in module order, padded and cut into equal shards rank by rank.
std::map<std::string, at::Tensor> SavedWeights(const std::string& role_dir,
                                               model::Transformer& like);

double LargestDifference(const std::map<std::string, at::Tensor>& a,
                         const std::map<std::string, at::Tensor>& b,
                         const std::vector<std::string>& names);

}  // namespace rlhfd::testing

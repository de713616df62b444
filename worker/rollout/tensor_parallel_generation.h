// Generation over a tensor-parallel group (rollout tp_g > 1 on CPU workers): every rank of the
// group runs its slice of every layer (all-reducing inside them, as TensorParallelTransformer
// does) over the same batch, gathers the sampled positions' logits from the vocabulary ranges,
// and draws with the engine's sampler and seeds, so every rank gets the same tokens, and the
// tokens of GenerationEngine over the whole model up to float rounding.
//
// Each step runs the model over the rows' whole prefixes (no KV cache): this path serves small
// models on CPU workers, and on GPUs the models the fused decode does not (GenerationEngine::
// CreateTensorParallel serves the rest with a KV cache).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/rollout/request.h"

namespace rlhfd::rollout {

// Every rank of the model's group calls it with the same requests (each with a seed) and EOS
// ids; results in request order, n samples each.
absl::StatusOr<std::vector<GenerationResult>> GenerateTensorParallel(
    parallel::TensorParallelTransformer& model, const std::vector<GenerationRequest>& requests,
    const std::vector<int64_t>& eos_token_ids, int64_t vocab_size);

// A tensor-parallel group decodes its ranks' prompts together: every rank calls this with its own
// requests and gets every rank's, in rank order (sent as int64 words, doubles bit for bit), and
// where its own begin. `device`: where the group's collectives take tensors (a GPU for NCCL).
struct GroupRequests {
  std::vector<GenerationRequest> all;
  size_t first = 0;  // this rank's requests are all[first, first + its count)
};
absl::StatusOr<GroupRequests> GatherGroupRequests(parallel::Communicator& group,
                                                  const std::vector<GenerationRequest>& requests,
                                                  const at::Device& device);

}  // namespace rlhfd::rollout

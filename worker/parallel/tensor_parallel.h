// Tensor parallelism (Megatron style) for the decoder: column-parallel q/k/v and gate/up (each
// rank holds heads / tp query and key/value heads and F / tp MLP columns), row-parallel o and
// down projections followed by an all-reduce, a vocabulary-parallel embedding (each rank looks up
// the ids in its vocabulary range; an all-reduce assembles the rows) and a vocabulary-parallel LM
// head with a parallel log-softmax and argmax, so no rank ever holds (B, T, V) logits.
//
// Weights are the rollout slices of reshard.h (TensorParallelSpecs gives every parameter's
// split), so resharding feeds this directly. Plain ATen ops on any device; padded right batches.
// The layer math is the decoder's own (model::AttentionHeads, GatedActivation, ApplyRmsNorm,
// Project in transformer.h), so its numerics are the decoder's: a float32 residual stream and
// float32 logits whatever the weights' dtype. It trains too: with slices that require grad,
// backward through TokenLogProbs gives every rank the gradient of its own slices (Megatron's f / g
// operators around the parallel layers).
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/reshard.h"

namespace rlhfd::parallel {

// What the tensor-parallel autograd functions share: the group, and the first failure of an
// all-reduce run inside them (forward or backward).
struct TensorParallelContext {
  Communicator* group;
  absl::Status status;
};

// How each parameter of `config`'s model splits under tensor parallelism.
std::vector<ShardedParameter> TensorParallelSpecs(const model::ModelConfig& config);

// Vocabulary parallelism, shared by the tensor-parallel decoders. This rank's rows of `ids` from
// its slice `embed` of the embedding (ids in [vocab_begin, vocab_begin + rows of embed)), zero
// for the others' ids: summed over the group, the embedding.
at::Tensor LocalEmbeddingRows(const at::Tensor& embed, const at::Tensor& ids, int64_t vocab_begin);
// Every rank's vocabulary range of `local` (..., V / tp), joined in rank order into (..., V), the
// same on every rank. `queued`: Communicator::AllGatherQueued.
absl::StatusOr<at::Tensor> GatherVocabulary(Communicator& group, const at::Tensor& local,
                                            bool queued = false);

// Whether `slices` holds this rank's slice of every parameter of `config`'s causal-LM model at
// tensor-parallel size `tp`, shaped so; heads, key/value heads, the MLP width and the vocabulary
// must divide by tp. The error names the parameter or the size to fix.
absl::Status CheckTensorParallelSlices(const model::ModelConfig& config,
                                       const std::map<std::string, at::Tensor>& slices, int tp);

// Scales the gradients of a tensor-parallel model's slices so their global L2 norm is at most
// `max_norm` (0: no scaling), as clipping the tp = 1 model would: the squares of split slices
// are summed over the group, those of replicated ones (alike on every rank) counted once.
// Returns the norm before scaling, the same on every rank. Every rank of `group` calls it.
absl::StatusOr<double> ClipTensorParallelGradNorm(const std::vector<ShardedParameter>& specs,
                                                  const std::map<std::string, at::Tensor>& slices,
                                                  Communicator& group, double max_norm);

class TensorParallelTransformer {
 public:
  // `slices`: this rank's slice of every parameter (by Hugging Face name), as RolloutSlice or
  // Reshard produce them for `group.size()`-way tensor parallelism. Heads, key/value heads, the
  // MLP width and the vocabulary must divide by it.
  static absl::StatusOr<TensorParallelTransformer> Create(const model::ModelConfig& config,
                                                          std::map<std::string, at::Tensor> slices,
                                                          Communicator& group);

  // Final hidden states (B, T, C) of ids (B, T), replicated on every rank.
  absl::StatusOr<at::Tensor> Hidden(const at::Tensor& ids);
  // Log-probability of `targets` (B, T) under the next-token distribution at each position.
  absl::StatusOr<at::Tensor> TokenLogProbs(const at::Tensor& hidden, const at::Tensor& targets);
  // The argmax token at each position (B, T).
  absl::StatusOr<at::Tensor> Argmax(const at::Tensor& hidden);
  // The full logits (B, T, V), gathered from the ranks' vocabulary ranges: the same on every
  // rank, for sampling (take the positions that are sampled from: it is B x T x V).
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& hidden);
  // Greedy continuation of one prompt (1, P) by `new_tokens` tokens (full forward per token).
  absl::StatusOr<std::vector<int64_t>> Greedy(const at::Tensor& prompt, int64_t new_tokens);
  // Where the slices are.
  at::Device device() const { return W("model.embed_tokens.weight").device(); }
  // After a backward pass: whether its all-reduces succeeded (then the gradients are whole).
  // Clears the recorded failure.
  absl::Status TakeStatus();

 private:
  TensorParallelTransformer(const model::ModelConfig& config,
                            std::map<std::string, at::Tensor> slices, Communicator& group);
  const at::Tensor& W(const std::string& name) const;
  // Local logits (B, T, V / tp) of this rank's vocabulary range.
  at::Tensor LocalLogits(const at::Tensor& hidden) const;
  // g and f (see TensorParallelContext).
  at::Tensor ReduceFrom(const at::Tensor& x) const;
  at::Tensor CopyTo(const at::Tensor& x) const;

  model::ModelConfig config_;
  std::map<std::string, at::Tensor> w_;
  Communicator* group_;
  std::unique_ptr<TensorParallelContext> context_;  // Stable address for the autograd graph.
  at::Tensor inv_freq_;
  int64_t vocab_begin_ = 0, vocab_size_ = 0;  // This rank's vocabulary range.
};

}  // namespace rlhfd::parallel

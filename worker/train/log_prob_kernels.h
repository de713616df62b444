// Launchers of the fused log-prob kernels behind ChunkedLogProbs on the GPU. Plain pointers and a
// stream, so the kernels compile with nvcc alone (no LibTorch headers); chunked_log_probs.cc
// checks the tensors and calls these only for contiguous float32 logits on the device.
//
// Each replaces several float32 passes over a chunk's (rows, V) logits with one: the forward
// reads the logits once (online log-sum-exp, entropy and the target's logit together), the
// backward reads them once and writes the logits' gradient straight in the GEMMs' dtype.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/model/element_type.h"

namespace rlhfd::train::kernels {

// logits (rows, vocab) float32, contiguous; targets (rows) int64.
// Writes, per row: log_prob = logits[target] - lse, entropy = lse - Σ p·logits (p the softmax)
// and lse = log Σ exp(logits), all float32; a target outside [0, vocab) gets a NaN log_prob.
// This and LogProbGradient return false when a launch fails.
bool LogProbRows(const float* logits, int rows, int vocab, const int64_t* targets, float* log_prob,
                 float* entropy, float* lse, cudaStream_t stream);

// The gradient of Σ g_log_prob·log_prob + g_entropy·entropy with respect to the logits:
//   grad = -p · (g_log_prob + g_entropy · (log p + entropy)) + onehot(target) · g_log_prob
// with p = exp(logits - lse). logits (rows, vocab) float32 contiguous; targets, lse, entropy,
// g_log_prob, g_entropy per row (float32 but targets); grad (rows, vocab) contiguous of `type`.
bool LogProbGradient(const float* logits, int rows, int vocab, const int64_t* targets,
                     const float* lse, const float* entropy, const float* g_log_prob,
                     const float* g_entropy, void* grad, model::kernels::ElementType type,
                     cudaStream_t stream);

}  // namespace rlhfd::train::kernels

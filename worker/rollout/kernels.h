// Launchers of the rollout engine's CUDA kernels. Plain pointers and a stream, so the kernels
// compile with nvcc alone (no LibTorch headers); decode_attention.cc and sampler.cc hold the
// tensor-level checks and call these only for inputs they have validated.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rlhfd::rollout::kernels {

// Decode attention over a paged cache for one new token per sequence.
//   q        (B, H, D) bf16, contiguous, rotated; q and the caches 16-byte aligned
//   k_cache, v_cache (blocks, K, block_size, D) bf16, contiguous
//   block_tables (B, max_blocks) int64: row b names sequence b's blocks, position p in block
//            block_tables[b][p / block_size]
//   positions (B) int64: each row's new-token position; keys [0, position] are attended
//   out      (B, H, D) bf16
//   workspace DecodeAttentionWorkspaceBytes(...) bytes of device memory (16-byte aligned)
// Serves D in {64, 128}, H / K <= 16 and block_size a multiple of 32 (DecodeAttentionServes);
// returns false (and launches nothing) otherwise, and false when a launch fails (out is then not
// written). `capacity` below is max_blocks * block_size.
bool DecodeAttentionServes(int heads, int kv_heads, int head_dim, int max_blocks, int block_size);
int64_t DecodeAttentionWorkspaceBytes(int batch, int heads, int head_dim, int capacity);
bool DecodeAttention(const void* q, const void* k_cache, const void* v_cache,
                     const int64_t* block_tables, const int64_t* positions, void* out,
                     void* workspace, int batch, int heads, int kv_heads, int head_dim,
                     int max_blocks, int block_size, float scale, cudaStream_t stream);

// One token per row of float32 `logits` (B, V) with row stride `row_stride`: the argmax where
// temperature is 0, else a Gumbel-max draw from softmax(logits / temperature) keyed by
// (seed, counter, vocabulary id). `logprobs` gets the drawn token's log-probability under the
// distribution it was drawn from (softmax(logits) for greedy rows). `workspace`:
// SampleRowsWorkspaceBytes(B) bytes of device memory. False when a launch fails.
int64_t SampleRowsWorkspaceBytes(int batch);
bool SampleRows(const float* logits, int64_t row_stride, int batch, int vocab,
                const float* temperature, const int64_t* seeds, const int64_t* counters,
                int64_t* tokens, float* logprobs, void* workspace, cudaStream_t stream);

// The fused decode step's elementwise kernels (bf16 activations, float32 residual stream):

// residual (rows, hidden) float32 += delta (or = delta when `assign`); out (rows, hidden) bf16 =
// weight * residual / rms(residual). Supports hidden a multiple of 4 up to 16,384, residual
// 16-byte and delta and out 8-byte aligned; returns false (and launches nothing) otherwise, and
// false when the launch fails.
bool AddRmsNorm(float* residual, const void* delta, bool assign, const void* weight, void* out,
                int rows, int hidden, float eps, cudaStream_t stream);

// qkv (rows, (H + 2K) * D) bf16, the fused projection's output (q heads, k heads, v heads).
// Queries (after q_norm, when given) rotated at positions[r] into q_out (rows, H, D); keys (after
// k_norm) rotated and values written to the paged caches (blocks, K, block_size, D) at cache row
// cache_rows[r] (block · block_size + offset), the rotated keys also to k_out (rows, K, D) unless
// it is null. inv_freq (D / 2) float32. Supports D in {64, 128} and rows · (H + 2K) below 2^33;
// returns false (and launches nothing) otherwise, and false when the launch fails.
bool RopeAppend(const void* qkv, const int64_t* positions, const int64_t* cache_rows,
                const float* inv_freq, const void* q_norm, const void* k_norm, float eps,
                void* q_out, void* k_out, void* k_cache, void* v_cache, int rows, int heads,
                int kv_heads, int head_dim, int block_size, cudaStream_t stream);

// gate_up (rows, 2 * width) bf16 → out (rows, width) bf16 = silu(gate) * up. `width` even;
// 16-byte vectors where it is a multiple of 8 and both pointers are 16-byte aligned. False when
// the launch fails.
//
// These three and the decode attention (both kernels) are launched as programmatic
// dependents of the stream's previous kernel (dependent_launch.cuh).
bool SiluMul(const void* gate_up, void* out, int64_t rows, int width, cudaStream_t stream);

}  // namespace rlhfd::rollout::kernels

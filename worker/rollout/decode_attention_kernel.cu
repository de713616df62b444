// Decode attention over a paged cache: one new query token per sequence attends the keys of the
// blocks its row of the block table names. Split-K ("flash decoding") on tensor cores: each warp
// serves one (sequence, key/value head, span of keys) for the head's whole query group, so each
// cached key and value is read once per step, and short batches still fill the GPU with spans. A
// second kernel merges the spans' online-softmax states.
//
// The warp computes S = Q·Kᵀ and O = P·V with mma.sync m16n8k16 (bf16 in, float32 accumulate):
// the query group fills the 16 rows of the A operand (groups of up to 16 query heads per
// key/value head; rows past the group are zeros), 32 keys at a time. Each chunk of 32 keys and
// their values is copied into the warp's ring of shared-memory stages with cp.async, kStages - 1
// chunks ahead of the one being computed, so that a warp keeps that many chunks of memory reads in
// flight without holding them in registers (the chunk's reads no longer wait behind its
// arithmetic). Each lane then reads its fragments from shared memory in 16-byte pieces, which
// works because a dot product does not care in which order its terms are summed, nor a sum of P·V
// rows in which order its keys come:
//   - Q·Kᵀ: the 16 head dimensions of one k-step are not d0 … d0+15 but the ones the lanes read
//     with one 16-byte load each (lane t of a key row reads dims 32c + 8t … 32c + 8t + 7, which
//     serve k-steps 2c and 2c + 1); Q's fragments use the same order, so S is exact.
//   - P·V: the output columns of n-tile j are not j·8 … j·8+7 but j + (D/8)·n for n = 0 … 7, so
//     lane g reads D/8 consecutive values of each of its value rows; a byte permute pairs two keys'
//     values into one fragment register.
// A stage's rows keep their 16-byte pieces in an order permuted by the row (Swizzle below), so
// that the eight lanes of each quarter-warp read eight different banks in both patterns.
// The softmax weights P are rounded to bf16 for their MMA, as FlashAttention does; the row sums
// that normalise them are the float32 values.
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "worker/rollout/dependent_launch.cuh"
#include "worker/rollout/kernels.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kChunkKeys = 32;  // Keys per warp iteration: four n-tiles of S.
constexpr int kMaxGroup = 16;   // The A operand's rows.
constexpr int kMaxSplits = 16;  // Spans per sequence at most (the merge reads them all).

__host__ __device__ constexpr int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Keys per span: 128, or more when the cache is long, so that the merge reads at most kMaxSplits
// spans; a multiple of kChunkKeys. It depends on the cache alone, never on the batch: a
// sequence's attention sums in the same order whatever else is decoded with it (a CUDA graph's
// padded batch included).
int KeysPerSplit(int capacity) {
  const int longest = CeilDiv(CeilDiv(capacity, kMaxSplits), kChunkKeys) * kChunkKeys;
  return longest > 128 ? longest : 128;
}

// Where the workspace's parts start, in floats: the spans' maxima, sums, then (16-byte aligned,
// for the kernel's vector stores) their outputs.
int64_t AccOffset(int64_t states) { return (2 * states + 3) / 4 * 4; }

// The shared memory of a block: per warp, kStages chunks of keys and of values.
constexpr int StageBytes(int d) { return 2 * kChunkKeys * d * 2; }
constexpr int SharedBytes(int d, int stages, int warps) { return warps * stages * StageBytes(d); }

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes from global to shared memory without passing through registers; zeros where !valid
// (nothing is read then).
__device__ __forceinline__ void CopyAsync(uint4* shared, const uint4* global, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The place of 16-byte piece `unit` of a stage's row `row` is unit ^ Swizzle(row). A quarter-warp
// reads, for Q·Kᵀ, pieces 4c … 4c + 3 of rows 2m and 2m + 1 (the swizzle's bit 2 follows the row's
// parity), and for P·V two pieces of four rows of one parity spaced by two (bits 1-2 at D 64, bits
// 0 and 2 at D 128 follow the row / 2): eight different banks in each case; each copy instruction
// writes eight pieces of one row, which the swizzle only permutes.
template <int D>
__device__ __forceinline__ int Swizzle(int row) {
  const int pair = (row >> 1) & 3;
  const int spread = D == 64 ? pair << 1 : (pair & 1) | ((pair & 2) << 1);
  return ((row & 1) << 2) ^ spread;
}

__device__ __forceinline__ uint32_t PackBf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ uint4 LoadOrZero(const __nv_bfloat16* p, bool valid) {
  return valid ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
}

// kWarps independent spans a block, one per warp, each with its own kStages-deep ring; a minimum
// of one block per SM lets the compiler give a lane the registers it asks for.
template <int D, int kStages, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 1)
    DecodeAttentionKernel(const __nv_bfloat16* __restrict__ q,
                          const __nv_bfloat16* __restrict__ k_cache,
                          const __nv_bfloat16* __restrict__ v_cache,
                          const int64_t* __restrict__ block_tables,
                          const int64_t* __restrict__ positions, float* __restrict__ partial_m,
                          float* __restrict__ partial_l, float* __restrict__ partial_acc, int batch,
                          int heads, int kv_heads, int max_blocks, int block_size, int splits,
                          int keys_per_split, float scale_log2) {
  static_assert(kStages >= 2, "a ring of one stage cannot read ahead");
  AwaitPrerequisites();
  AllowDependents();
  constexpr int kPieces = D / 32;   // 16-byte pieces a lane reads of a key row.
  constexpr int kTiles = D / 8;     // n-tiles of P·V; also the values a lane reads of a value row.
  constexpr int kRowUnits = D / 8;  // 16-byte pieces of a key or value row.
  constexpr int kTileUnits = kChunkKeys * kRowUnits;  // Of a chunk's keys (or values).
  extern __shared__ uint4 shared_units[];
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = threadIdx.x / 32;
  uint4* const ring = shared_units + static_cast<size_t>(warp) * kStages * 2 * kTileUnits;
  // Spans in split-major order, so that a block's warps have like amounts of work (the same span
  // of sequences of like lengths) rather than one sequence's long and empty spans.
  const int item = blockIdx.x * kWarps + warp;
  if (item >= batch * kv_heads * splits) return;
  const int split = item / (batch * kv_heads), kv_head = item % kv_heads;
  const int row = (item / kv_heads) % batch;
  const int group = heads / kv_heads;
  const int length = static_cast<int>(positions[row]) + 1;
  const int begin = split * keys_per_split;
  const int end = min(length, begin + keys_per_split);
  // State index of this group's first query head in this span.
  const size_t first_state = (static_cast<size_t>(row) * splits + split) * heads + kv_head * group;
  if (begin >= length) {  // A span past the sequence's end: an empty state, merged as none.
    if (lane < group) partial_m[first_state + lane] = -INFINITY;
    return;
  }
  // A chunk of 32 keys lies in one block (spans and blocks are multiples of 32 keys): the chunk's
  // keys are consecutive rows of that block's part for this key/value head.
  const int64_t* table = block_tables + static_cast<size_t>(row) * max_blocks;
  const int chunks = CeilDiv(end - begin, kChunkKeys);
  const auto block_of = [&](int chunk) { return table[(begin + chunk * kChunkKeys) / block_size]; };
  // Copies chunk `chunk` (in `block`) into its stage; rows past the span's end become zeros (the
  // cache there may hold anything, and a value's NaN times a weight of 0 would be NaN).
  const auto issue = [&](int chunk, int64_t block) {
    const int base = begin + chunk * kChunkKeys;
    const size_t offset =
        ((static_cast<size_t>(block) * kv_heads + kv_head) * block_size + base % block_size) * D;
    const auto* keys = reinterpret_cast<const uint4*>(k_cache + offset);
    const auto* values = reinterpret_cast<const uint4*>(v_cache + offset);
    uint4* const stage = ring + (chunk % kStages) * 2 * kTileUnits;
#pragma unroll
    for (int n = 0; n < kRowUnits; ++n) {  // kTileUnits / 32 pieces a lane.
      const int unit = 32 * n + lane, key = unit / kRowUnits;
      const int at = key * kRowUnits + ((unit % kRowUnits) ^ Swizzle<D>(key));
      CopyAsync(stage + at, keys + unit, base + key < end);
      CopyAsync(stage + kTileUnits + at, values + unit, base + key < end);
    }
  };

  // Q's A fragments: rows g and g + 8 of the group, in the lanes' order of head dimensions. At
  // D = 128 they are held (2·D/8 registers per lane); at D = 64 they are read again from L1 for
  // each piece of the head dimension, which measured faster there than a variant that held them
  // (docs/PERFORMANCE.md, "Decode attention on tensor cores").
  constexpr bool kHoldQuery = D >= 128;
  const __nv_bfloat16* q_low = q + (static_cast<size_t>(row) * heads + kv_head * group + g) * D;
  const __nv_bfloat16* q_high = q_low + 8 * D;
  const auto query_fragments = [&](int c, uint32_t(&even)[4], uint32_t(&odd)[4]) {
    const uint4 low = LoadOrZero(q_low + 32 * c + 8 * t, g < group);
    const uint4 high = LoadOrZero(q_high + 32 * c + 8 * t, g + 8 < group);
    even[0] = low.x, even[1] = high.x, even[2] = low.y, even[3] = high.y;  // k-step 2c
    odd[0] = low.z, odd[1] = high.z, odd[2] = low.w, odd[3] = high.w;      // k-step 2c + 1
  };
  // The ring's first kStages - 1 chunks; one group of copies per chunk (empty ones too, so that
  // group n always holds chunk n).
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < chunks) issue(c, block_of(c));
    CommitCopies();
  }
  // The block of the next chunk to copy, read one iteration ahead of its copy.
  int64_t ahead = kStages - 1 < chunks ? block_of(kStages - 1) : 0;

  uint32_t held[kHoldQuery ? 2 * kPieces : 1][4];
  if constexpr (kHoldQuery) {
#pragma unroll
    for (int c = 0; c < kPieces; ++c) query_fragments(c, held[2 * c], held[2 * c + 1]);
  }

  // Online softmax of rows g (index 0) and g + 8 (index 1), in the exp2 domain. l is this lane's
  // share of the row sum (its keys), summed over the row's four lanes at the end.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int chunk = 0; chunk < chunks; ++chunk) {
    // This lane's copies of `chunk` are done; the warp's, after the __syncwarp, which also ends
    // every lane's reads of the stage the next copy overwrites (the previous chunk's).
    WaitCopies<kStages - 2>();
    __syncwarp();
    const int later = chunk + kStages - 1;
    if (later < chunks) {
      issue(later, ahead);
      ahead = later + 1 < chunks ? block_of(later + 1) : 0;
    }
    CommitCopies();
    const uint4* key_units = ring + (chunk % kStages) * 2 * kTileUnits;
    const uint4* value_units = key_units + kTileUnits;
    const int base = begin + chunk * kChunkKeys;
    // S for keys base + 8i + 2t + {0, 1} (n-tile i) of rows g, g + 8. Keys past the span were
    // copied as zeros and are masked below.
    float s[4][4] = {};
    const auto key_piece = [&](int i, int c) {
      const int key = 8 * i + g;  // Within the chunk.
      return key_units[key * kRowUnits + ((4 * c + t) ^ Swizzle<D>(key))];
    };
    if constexpr (kHoldQuery) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint4 k[kPieces];
#pragma unroll
        for (int c = 0; c < kPieces; ++c) k[c] = key_piece(i, c);
#pragma unroll
        for (int c = 0; c < kPieces; ++c) {
          Mma(s[i], held[2 * c], k[c].x, k[c].y);
          Mma(s[i], held[2 * c + 1], k[c].z, k[c].w);
        }
      }
    } else {
#pragma unroll
      for (int c = 0; c < kPieces; ++c) {
        uint32_t even[4], odd[4];
        query_fragments(c, even, odd);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 k = key_piece(i, c);
          Mma(s[i], even, k.x, k.y);
          Mma(s[i], odd, k.z, k.w);
        }
      }
    }
    float chunk_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool valid = base + 8 * i + 2 * t + (e & 1) < end;
        s[i][e] = valid ? s[i][e] * scale_log2 : -INFINITY;
        chunk_max[e / 2] = fmaxf(chunk_max[e / 2], s[i][e]);
      }
    }
    float correction[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // The row's 32 keys sit in its four lanes; key `base` is always valid, so this is finite.
      chunk_max[r] = fmaxf(chunk_max[r], __shfl_xor_sync(0xffffffff, chunk_max[r], 1));
      chunk_max[r] = fmaxf(chunk_max[r], __shfl_xor_sync(0xffffffff, chunk_max[r], 2));
      const float m_new = fmaxf(m[r], chunk_max[r]);
      correction[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= correction[r];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[i][e] = exp2f(s[i][e] - m[e / 2]);
        l[e / 2] += s[i][e];
      }
    }
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      acc[j][0] *= correction[0], acc[j][1] *= correction[0];
      acc[j][2] *= correction[1], acc[j][3] *= correction[1];
    }
    // O += P·V over two k-steps of 16 keys: P's A fragments are S's accumulators (n-tiles 2h and
    // 2h + 1); lane t's value rows are keys base + 16h + 2t + {0, 1, 8, 9}.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pa[4] = {
          PackBf16(s[2 * h][0], s[2 * h][1]), PackBf16(s[2 * h][2], s[2 * h][3]),
          PackBf16(s[2 * h + 1][0], s[2 * h + 1][1]), PackBf16(s[2 * h + 1][2], s[2 * h + 1][3])};
      // Value rows +0, +1, +8, +9 (b0 pairs the first two keys, b1 the other two), all loaded
      // before the MMAs.
      uint32_t v[4][kTiles / 2];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = 16 * h + 2 * t + (r & 1) + 8 * (r / 2);  // Within the chunk.
#pragma unroll
        for (int p = 0; p < kTiles / 8; ++p) {
          const int unit = g * (kTiles / 8) + p;
          const uint4 piece = value_units[key * kRowUnits + (unit ^ Swizzle<D>(key))];
          v[r][4 * p] = piece.x, v[r][4 * p + 1] = piece.y;
          v[r][4 * p + 2] = piece.z, v[r][4 * p + 3] = piece.w;
        }
      }
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const unsigned selector = j % 2 == 0 ? 0x5410 : 0x7632;  // Low or high halves.
        Mma(acc[j], pa, __byte_perm(v[0][j / 2], v[1][j / 2], selector),
            __byte_perm(v[2][j / 2], v[3][j / 2], selector));
      }
    }
  }

  // This span's state per query head: (max, sum, unnormalised output). Lane (g, t) holds output
  // columns j + kTiles·2t and j + kTiles·(2t + 1) of n-tile j: 2·kTiles consecutive columns.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    const int head = g + 8 * r;
    if (head >= group) continue;
    const size_t state = first_state + head;
    if (t == 0) partial_m[state] = m[r], partial_l[state] = l[r];
    float* out = partial_acc + state * D + 2 * kTiles * t;
#pragma unroll
    for (int j = 0; j < kTiles; j += 4) {
      *reinterpret_cast<float4*>(out + j) =
          make_float4(acc[j][2 * r], acc[j + 1][2 * r], acc[j + 2][2 * r], acc[j + 3][2 * r]);
      *reinterpret_cast<float4*>(out + kTiles + j) = make_float4(
          acc[j][2 * r + 1], acc[j + 1][2 * r + 1], acc[j + 2][2 * r + 1], acc[j + 3][2 * r + 1]);
    }
  }
}

// Merges the spans: one warp per (sequence, query head), kMergeWarps warps a block. Lane s reads
// span s's max and sum, and every lane reads its D / 32 consecutive outputs of every span that
// holds keys, all loads issued before any is used: the merge waits on one memory round trip after
// the sequence's length, not on one per span as a loop over the spans does. The spans' outputs are
// summed in span order (the sum of their weights by a shuffle tree), the same order whatever the
// batch.
constexpr int kMergeWarps = 4;

template <int D>
__global__ void __launch_bounds__(kMergeWarps * 32)
    MergeSplitsKernel(const float* __restrict__ partial_m, const float* __restrict__ partial_l,
                      const float* __restrict__ partial_acc, const int64_t* __restrict__ positions,
                      __nv_bfloat16* __restrict__ out, int batch, int heads, int splits,
                      int keys_per_split) {
  AwaitPrerequisites();
  AllowDependents();
  constexpr int kPer = D / 32;  // Output columns per lane: 2 or 4.
  const int item = blockIdx.x * kMergeWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (item >= batch * heads) return;  // A whole warp: item is per warp.
  const int row = item / heads, head = item % heads;
  const size_t first = static_cast<size_t>(row) * splits * heads + head;  // State of span 0.
  // The spans that hold keys (span 0 always does); the attention kernel wrote no state past them.
  const int used = min(splits, static_cast<int>(positions[row]) / keys_per_split + 1);
  const bool mine = lane < used;
  const float m = mine ? partial_m[first + static_cast<size_t>(lane) * heads] : -INFINITY;
  const float l = mine ? partial_l[first + static_cast<size_t>(lane) * heads] : 0.f;
  float acc[kMaxSplits][kPer];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
    if (s >= used) break;
    const float* piece = partial_acc + (first + static_cast<size_t>(s) * heads) * D + kPer * lane;
    if constexpr (kPer == 4) {
      const float4 v = *reinterpret_cast<const float4*>(piece);
      acc[s][0] = v.x, acc[s][1] = v.y, acc[s][2] = v.z, acc[s][3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(piece);
      acc[s][0] = v.x, acc[s][1] = v.y;
    }
  }
  float m_max = m;
  for (int offset = 16; offset > 0; offset /= 2) {
    m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffff, m_max, offset));
  }
  // Span 0 always holds the sequence's first key, so m_max is finite.
  const float f = mine ? exp2f(m - m_max) : 0.f;
  float l_total = l * f;
  for (int offset = 16; offset > 0; offset /= 2) {
    l_total += __shfl_xor_sync(0xffffffff, l_total, offset);
  }
  float o[kPer] = {};
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
    if (s >= used) break;
    const float weight = __shfl_sync(0xffffffff, f, s);
#pragma unroll
    for (int i = 0; i < kPer; ++i) o[i] += acc[s][i] * weight;
  }
  __nv_bfloat16* target = out + (static_cast<size_t>(row) * heads + head) * D + kPer * lane;
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    *reinterpret_cast<__nv_bfloat162*>(target + i) =
        __floats2bfloat162_rn(o[i] / l_total, o[i + 1] / l_total);
  }
}

// What a launch of the span kernel takes besides its template arguments.
struct SpanArgs {
  const __nv_bfloat16 *q, *k_cache, *v_cache;
  const int64_t *block_tables, *positions;
  float *partial_m, *partial_l, *partial_acc;
  int batch, heads, kv_heads, max_blocks, block_size, splits, keys_per_split;
  float scale_log2;
};

// The largest dynamic shared memory a block of `device` may opt into (0 when unknown).
int SharedMemoryLimit(int device) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
      cudaSuccess) {
    return 0;
  }
  return bytes;
}

// Launches the span kernel with a ring of kStages chunks for each of kWarps warps a block; false
// when the device does not allow it that much shared memory or the launch failed.
template <int D, int kStages, int kWarps>
bool LaunchSpans(const SpanArgs& a, int device, cudaStream_t stream) {
  constexpr int kBytes = SharedBytes(D, kStages, kWarps);
  const auto kernel = DecodeAttentionKernel<D, kStages, kWarps>;
  if (kBytes > 48 * 1024) {
    // Beyond 48 KiB a kernel's shared memory must be allowed on each device, once (a CUDA graph's
    // capture may call this too: it enqueues nothing).
    static std::atomic<uint64_t> allowed{0};
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (bit == 0 || (allowed.load(std::memory_order_acquire) & bit) == 0) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes) !=
          cudaSuccess) {
        cudaGetLastError();  // Not sticky: clear it, the caller hears false.
        return false;
      }
      allowed.fetch_or(bit, std::memory_order_release);
    }
  }
  return LaunchDependent(kernel, CeilDiv(a.batch * a.kv_heads * a.splits, kWarps), kWarps * 32,
                         kBytes, stream, a.q, a.k_cache, a.v_cache, a.block_tables, a.positions,
                         a.partial_m, a.partial_l, a.partial_acc, a.batch, a.heads, a.kv_heads,
                         a.max_blocks, a.block_size, a.splits, a.keys_per_split,
                         a.scale_log2) == cudaSuccess;
}

// The ring: three stages of four warps where the device's shared memory holds them (measured
// within 3 % of the fastest shape at each size: docs/PERFORMANCE.md, "… decode attention from
// shared memory"), else, or if that launch fails, two stages of one warp (32 KiB at D 128, within
// every sm_80-and-later GPU's 48 KiB; its output is bitwise the same, checked on an H100 in the
// same harness).
template <int D>
bool LaunchSpansFor(const SpanArgs& a, cudaStream_t stream) {
  constexpr int kStages = 3, kWarps = 4;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (SharedBytes(D, kStages, kWarps) <= SharedMemoryLimit(device) &&
      LaunchSpans<D, kStages, kWarps>(a, device, stream)) {
    return true;
  }
  return LaunchSpans<D, 2, 1>(a, device, stream);
}

template <int D>
bool LaunchMerge(const SpanArgs& a, __nv_bfloat16* out, cudaStream_t stream) {
  return LaunchDependent(MergeSplitsKernel<D>, CeilDiv(a.batch * a.heads, kMergeWarps),
                         kMergeWarps * 32, 0, stream, a.partial_m, a.partial_l, a.partial_acc,
                         a.positions, out, a.batch, a.heads, a.splits,
                         a.keys_per_split) == cudaSuccess;
}

SpanArgs SpanArgsFor(const void* q, const void* k_cache, const void* v_cache,
                     const int64_t* block_tables, const int64_t* positions, void* workspace,
                     int batch, int heads, int kv_heads, int max_blocks, int block_size,
                     float scale) {
  const int capacity = max_blocks * block_size;
  const int keys_per_split = KeysPerSplit(capacity);
  const int splits = CeilDiv(capacity, keys_per_split);
  const size_t states = static_cast<size_t>(batch) * splits * heads;
  auto* partial_m = static_cast<float*>(workspace);
  return {.q = static_cast<const __nv_bfloat16*>(q),
          .k_cache = static_cast<const __nv_bfloat16*>(k_cache),
          .v_cache = static_cast<const __nv_bfloat16*>(v_cache),
          .block_tables = block_tables,
          .positions = positions,
          .partial_m = partial_m,
          .partial_l = partial_m + states,
          .partial_acc = partial_m + AccOffset(static_cast<int64_t>(states)),
          .batch = batch,
          .heads = heads,
          .kv_heads = kv_heads,
          .max_blocks = max_blocks,
          .block_size = block_size,
          .splits = splits,
          .keys_per_split = keys_per_split,
          .scale_log2 = scale * 1.4426950408889634f};
}

}  // namespace

int64_t DecodeAttentionWorkspaceBytes(int batch, int heads, int head_dim, int capacity) {
  const int64_t states =
      static_cast<int64_t>(batch) * CeilDiv(capacity, KeysPerSplit(capacity)) * heads;
  return (AccOffset(states) + states * head_dim) * static_cast<int64_t>(sizeof(float));
}

bool DecodeAttentionServes(int heads, int kv_heads, int head_dim, int max_blocks, int block_size) {
  return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup &&
         (head_dim == 64 || head_dim == 128) && block_size > 0 && block_size % kChunkKeys == 0 &&
         max_blocks > 0;
}

bool DecodeAttention(const void* q, const void* k_cache, const void* v_cache,
                     const int64_t* block_tables, const int64_t* positions, void* out,
                     void* workspace, int batch, int heads, int kv_heads, int head_dim,
                     int max_blocks, int block_size, float scale, cudaStream_t stream) {
  if (!DecodeAttentionServes(heads, kv_heads, head_dim, max_blocks, block_size)) return false;
  if (batch == 0) return true;
  const SpanArgs args = SpanArgsFor(q, k_cache, v_cache, block_tables, positions, workspace, batch,
                                    heads, kv_heads, max_blocks, block_size, scale);
  auto* attention = static_cast<__nv_bfloat16*>(out);
  if (head_dim == 64) {
    return LaunchSpansFor<64>(args, stream) && LaunchMerge<64>(args, attention, stream);
  }
  return LaunchSpansFor<128>(args, stream) && LaunchMerge<128>(args, attention, stream);
}

}  // namespace rlhfd::rollout::kernels

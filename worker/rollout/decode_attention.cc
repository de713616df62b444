#include "worker/rollout/decode_attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "worker/model/transformer.h"
#if RLHFD_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>

#include "worker/rollout/kernels.h"
#endif

namespace rlhfd::rollout {

at::Tensor DecodeAttentionReference(const at::Tensor& q, const at::Tensor& k_cache,
                                    const at::Tensor& v_cache, const at::Tensor& slots,
                                    const at::Tensor& positions) {
  const int64_t capacity = k_cache.size(2);
  const at::Tensor keys = k_cache.index_select(0, slots);  // (B, K, capacity, D)
  const at::Tensor values = v_cache.index_select(0, slots);
  const at::Tensor key_index = at::arange(capacity, positions.options()).unsqueeze(0);
  const at::Tensor mask = (key_index <= positions.unsqueeze(1)).view({-1, 1, 1, capacity});
  return model::ScaledDotProductAttention(q, keys, values, mask);
}

at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& slots,
                           const at::Tensor& positions) {
#if RLHFD_HAVE_CUDA
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(3);
  // The kernel reads 16-byte pieces of q and of the cache's rows.
  const auto aligned = [](const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  const bool supported =
      q.is_cuda() && q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
      k_cache.is_contiguous() && v_cache.is_contiguous() && aligned(k_cache) && aligned(v_cache) &&
      q.size(2) == 1 && slots.scalar_type() == at::kLong && positions.scalar_type() == at::kLong;
  const at::Tensor query = supported ? q.contiguous() : q;
  if (supported && aligned(query)) {
    const at::Tensor slot_ids = slots.contiguous(), new_positions = positions.contiguous();
    at::Tensor out = at::empty_like(query);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const at::Tensor workspace =
        at::empty({kernels::DecodeAttentionWorkspaceBytes(
                      static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(head_dim),
                      static_cast<int>(k_cache.size(2)))},
                  q.options().dtype(at::kByte));
    if (kernels::DecodeAttention(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                 slot_ids.data_ptr<int64_t>(), new_positions.data_ptr<int64_t>(),
                                 out.data_ptr(), workspace.data_ptr(), static_cast<int>(batch),
                                 static_cast<int>(heads), static_cast<int>(k_cache.size(1)),
                                 static_cast<int>(head_dim), static_cast<int>(k_cache.size(2)),
                                 scale, c10::cuda::getCurrentCUDAStream(q.device().index()))) {
      return out;
    }
  }
#endif
  return DecodeAttentionReference(q, k_cache, v_cache, slots, positions);
}

}  // namespace rlhfd::rollout

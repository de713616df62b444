// Finiteness of many tensors at once; see finite_check.h.
#include "worker/train/finite_check.h"

#include <ATen/ATen.h>

#include <cmath>

namespace rlhfd::train {

std::optional<size_t> FirstNonFinite(const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> checked;
  std::vector<size_t> positions;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.numel() == 0 || !t.is_floating_point()) continue;
    checked.push_back(t.detach());
    positions.push_back(i);
  }
  if (checked.empty()) return std::nullopt;
  // The infinity norm of each tensor: NaN when it holds a NaN, inf when it holds an infinity.
  std::vector<at::Tensor> largest = at::_foreach_norm(checked, INFINITY);
  const at::Device device = largest.front().device();
  for (at::Tensor& norm : largest) {
    if (norm.device() != device) norm = norm.to(device);
  }
  const at::Tensor finite = at::isfinite(at::stack(largest).to(at::kDouble)).to(at::kCPU);
  const bool* flags = finite.data_ptr<bool>();
  for (size_t k = 0; k < positions.size(); ++k) {
    if (!flags[k]) return positions[k];
  }
  return std::nullopt;
}

}  // namespace rlhfd::train

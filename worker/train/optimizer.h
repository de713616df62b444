// AdamW over float32 master parameters with ATen's fused multi-tensor kernel (one launch for all
// parameters on the GPU; the CPU has the same fused op), and global gradient-norm clipping.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace rlhfd::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class AdamW {
 public:
  // `params` must be float32 (float64 in tests) leaf tensors of one device; their .grad() is
  // read at each step.
  AdamW(std::vector<at::Tensor> params, AdamWOptions options);

  // Scales gradients so their global L2 norm is at most `max_norm` (0 leaves them) and returns
  // the norm before scaling. Gradients that are not finite are left as they are (the norm says so).
  double ClipGradNorm(double max_norm);
  // One update with learning rate `lr`; parameters without a gradient are skipped.
  void Step(double lr);
  void ZeroGrad();

  const std::vector<at::Tensor>& params() const { return params_; }
  // The moments and step counts as tensors that alias them, named by parameter position
  // ("exp_avg.3"): what a checkpoint writes and restores in place.
  std::vector<std::pair<std::string, at::Tensor>> State() const;

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, steps_;
  AdamWOptions options_;
};

}  // namespace rlhfd::train

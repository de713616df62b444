// AdamW via at::_fused_adamw_; see optimizer.h.
#include "worker/train/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace rlhfd::train {

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options)
    : params_(std::move(params)), options_(options) {
  for (const at::Tensor& p : params_) {
    TORCH_CHECK(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble,
                "AdamW keeps float32 (or float64) master parameters");
    exp_avg_.push_back(at::zeros_like(p));
    exp_avg_sq_.push_back(at::zeros_like(p));
    // Float32 whatever the parameters' dtype, as torch.optim keeps steps for the fused kernels:
    // with float64 steps (float64 parameters) the CUDA kernel produced NaN.
    steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
}

double AdamW::ClipGradNorm(double max_norm) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  // One norm per tensor in one launch, then the norm of norms: the global L2 norm.
  const double norm = at::stack(at::_foreach_norm(grads, 2)).norm().item<double>();
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    at::_foreach_mul_(grads, max_norm / (norm + 1e-6));
  }
  return norm;
}

void AdamW::Step(double lr) {
  std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    params.push_back(params_[i]);
    grads.push_back(params_[i].grad());
    exp_avg.push_back(exp_avg_[i]);
    exp_avg_sq.push_back(exp_avg_sq_[i]);
    steps.push_back(steps_[i]);
  }
  if (params.empty()) return;
  at::NoGradGuard no_grad;
  at::_foreach_add_(steps, 1);
  at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr,
                    options_.beta1, options_.beta2, options_.weight_decay, options_.eps,
                    /*amsgrad=*/false, /*maximize=*/false);
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::State() const {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string index = std::to_string(i);
    state.emplace_back("exp_avg." + index, exp_avg_[i]);
    state.emplace_back("exp_avg_sq." + index, exp_avg_sq_[i]);
    state.emplace_back("step." + index, steps_[i]);
  }
  return state;
}

void AdamW::ZeroGrad() {
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

}  // namespace rlhfd::train

#include "worker/train/distributed/sharded_optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "common/status/status_macros.h"

namespace rlhfd::train {
namespace {

at::ScalarType Wide(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

ShardedAdamW::ShardedAdamW(std::vector<at::Tensor> params, parallel::Communicator& group,
                           AdamWOptions options)
    : params_(std::move(params)), group_(group) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : params_) {
    flat.push_back(p.detach().reshape({-1}).to(Wide(p)));
    total_ += p.numel();
  }
  shard_size_ = (total_ + group.size() - 1) / group.size();
  at::Tensor padded = at::zeros({shard_size_ * group.size()}, flat.front().options());
  padded.narrow(0, 0, total_).copy_(at::cat(flat));
  master_ = padded.narrow(0, group.rank() * shard_size_, shard_size_).clone();
  optimizer_ = std::make_unique<AdamW>(std::vector<at::Tensor>{master_}, options);
}

std::vector<std::pair<std::string, at::Tensor>> ShardedAdamW::State() const {
  std::vector<std::pair<std::string, at::Tensor>> state = {{"master", master_}};
  for (auto& entry : optimizer_->State()) state.push_back(std::move(entry));
  return state;
}

absl::StatusOr<double> ShardedAdamW::Step(double lr, double max_norm) {
  at::NoGradGuard no_grad;
  const auto options = master_.options();
  at::Tensor flat_grad = at::zeros({shard_size_ * group_.size()}, options);
  int64_t offset = 0;
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) {
      flat_grad.narrow(0, offset, p.numel()).copy_(p.grad().reshape({-1}));
      p.mutable_grad() = at::Tensor();  // The full gradient is no longer needed.
    }
    offset += p.numel();
  }
  at::Tensor grad_shard = at::empty({shard_size_}, options);
  RETURN_IF_ERROR(group_.ReduceScatter(flat_grad, grad_shard, parallel::ReduceOp::kAvg));
  flat_grad = at::Tensor();
  at::Tensor squares = grad_shard.pow(2).sum().reshape({1});
  RETURN_IF_ERROR(group_.AllReduce(squares, parallel::ReduceOp::kSum));
  const double norm = std::sqrt(squares.item<double>());
  // Every rank has the same norm, so all skip together: nothing non-finite reaches the masters.
  if (!std::isfinite(norm)) return norm;
  if (max_norm > 0 && norm > max_norm) {
    grad_shard.mul_(max_norm / (norm + 1e-6));  // As torch's clip_grad_norm_ and AdamW.
  }
  master_.mutable_grad() = grad_shard;
  optimizer_->Step(lr);
  master_.mutable_grad() = at::Tensor();
  at::Tensor full = at::empty({shard_size_ * group_.size()}, options);
  RETURN_IF_ERROR(group_.AllGather(master_, full));
  offset = 0;
  for (at::Tensor& p : params_) {
    p.detach().copy_(full.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return norm;
}

}  // namespace rlhfd::train

#include "worker/train/update_loop.h"

#include <ATen/ATen.h>

#include <chrono>

namespace rlhfd::train {

UpdateMetrics RunUpdateLoop(model::Transformer& model, AdamW& optimizer,
                            const at::Tensor& response_mask, const at::Tensor& attention_mask,
                            const UpdateLoopOptions& options, const MicroStep& micro_step) {
  const int64_t b = response_mask.size(0);
  const auto start = std::chrono::steady_clock::now();
  const bool checkpointing_before = model->activation_checkpointing();
  model->set_activation_checkpointing(options.micro.activation_checkpointing);
  // Real tokens per row (the token budget's unit) and response tokens per row, on the host.
  const at::Tensor real = attention_mask.defined()
                              ? attention_mask.sum(1).to(at::kLong).cpu()
                              : at::full({b}, response_mask.size(1) + 1, at::kLong);
  const std::vector<int64_t> tokens(real.data_ptr<int64_t>(), real.data_ptr<int64_t>() + b);
  const at::Tensor responses = response_mask.sum(1).to(at::kDouble).cpu();
  const double* response_tokens = responses.data_ptr<double>();

  UpdateMetrics sums;
  int64_t micro_steps = 0, optimizer_steps = 0;
  double trained_tokens = 0;
  const at::Generator generator = at::detail::createCPUGenerator(options.seed);
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    const at::Tensor order = at::randperm(b, generator, at::TensorOptions().dtype(at::kLong));
    for (int64_t mini = 0; mini < b; mini += options.mini_batch) {
      const int64_t count = std::min(options.mini_batch, b - mini);
      const std::vector<int64_t> mini_rows(order.data_ptr<int64_t>() + mini,
                                           order.data_ptr<int64_t>() + mini + count);
      double mini_tokens = 0;
      for (int64_t row : mini_rows) mini_tokens += response_tokens[row];
      optimizer.ZeroGrad();
      for (const std::vector<int64_t>& rows : SplitMicroBatches(
               mini_rows, tokens, options.micro.micro_batch, options.micro.micro_batch_tokens)) {
        double micro_tokens = 0;
        for (int64_t row : rows) micro_tokens += response_tokens[row];
        const at::Tensor index = at::tensor(rows, at::kLong).to(response_mask.device());
        micro_step(index, micro_tokens / std::max(mini_tokens, 1.0), sums);
        trained_tokens += micro_tokens;
        ++micro_steps;
      }
      sums["grad_norm"] += optimizer.ClipGradNorm(options.grad_clip);
      optimizer.Step(options.lr);
      ++optimizer_steps;
    }
  }
  model->set_activation_checkpointing(checkpointing_before);
  UpdateMetrics metrics;
  for (const auto& [name, value] : sums) {
    metrics[name] = value / (name == "grad_norm" ? optimizer_steps : micro_steps);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics["lr"] = options.lr;
  metrics["optimizer_steps"] = static_cast<double>(optimizer_steps);
  metrics["response_tokens_per_s"] = trained_tokens / std::max(seconds, 1e-9);
  return metrics;
}

}  // namespace rlhfd::train

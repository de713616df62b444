// The shared update loop; see update_loop.h.
#include "worker/train/update_loop.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"

namespace rlhfd::train {
namespace {

absl::StatusOr<UpdateMetrics> Loop(model::Transformer& model, AdamW& optimizer,
                                   const at::Tensor& response_mask,
                                   const at::Tensor& attention_mask,
                                   const UpdateLoopOptions& options, const MicroStep& micro_step) {
  const int64_t b = response_mask.size(0);
  const auto start = std::chrono::steady_clock::now();
  // Real tokens per row (the token budget's unit) and response tokens per row, on the host.
  const at::Tensor real = attention_mask.defined()
                              ? attention_mask.sum(1).to(at::kLong).cpu()
                              : at::full({b}, response_mask.size(1) + 1, at::kLong);
  const std::vector<int64_t> tokens(real.data_ptr<int64_t>(), real.data_ptr<int64_t>() + b);
  const at::Tensor responses = response_mask.sum(1).to(at::kDouble).cpu();
  const double* response_tokens = responses.data_ptr<double>();
  const double horizon = options.loss_horizon > 0 ? options.loss_horizon
                                                  : responses.max().item<double>();

  UpdateMetrics sums;
  int64_t optimizer_steps = 0;
  double trained_tokens = 0;
  const at::Generator generator = at::detail::createCPUGenerator(options.seed);
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    const at::Tensor order = at::randperm(b, generator, at::TensorOptions().dtype(at::kLong));
    for (int64_t mini = 0; mini < b; mini += options.mini_batch) {
      const int64_t count = std::min(options.mini_batch, b - mini);
      const std::vector<int64_t> mini_rows(order.data_ptr<int64_t>() + mini,
                                           order.data_ptr<int64_t>() + mini + count);
      LossScale scale{.horizon = horizon};
      for (int64_t row : mini_rows) {
        scale.tokens += response_tokens[row];
        scale.sequences += response_tokens[row] > 0 ? 1 : 0;
      }
      optimizer.ZeroGrad();
      for (const std::vector<int64_t>& rows : SplitMicroBatches(
               mini_rows, tokens, options.micro.micro_batch, options.micro.micro_batch_tokens)) {
        double micro_tokens = 0;
        for (int64_t row : rows) micro_tokens += response_tokens[row];
        const MicroBatch micro{at::tensor(rows, at::kLong).to(response_mask.device()), scale,
                               micro_tokens / std::max(scale.tokens, 1.0)};
        RETURN_IF_ERROR(micro_step(micro, sums));
        trained_tokens += micro_tokens;
      }
      sums["grad_norm"] += optimizer.ClipGradNorm(options.grad_clip);
      optimizer.Step(options.lr);
      ++optimizer_steps;
    }
  }
  UpdateMetrics metrics;
  for (const auto& [name, value] : sums) metrics[name] = value / std::max<int64_t>(optimizer_steps, 1);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics["lr"] = options.lr;
  metrics["optimizer_steps"] = static_cast<double>(optimizer_steps);
  metrics["response_tokens_per_s"] = trained_tokens / std::max(seconds, 1e-9);
  return metrics;
}

}  // namespace

absl::StatusOr<UpdateMetrics> RunUpdateLoop(model::Transformer& model, AdamW& optimizer,
                                            const at::Tensor& response_mask,
                                            const at::Tensor& attention_mask,
                                            const UpdateLoopOptions& options,
                                            const MicroStep& micro_step) {
  if (options.mini_batch < 1 || options.epochs < 1) {
    return absl::InvalidArgumentError("the update needs mini_batch >= 1 and epochs >= 1");
  }
  const bool checkpointing_before = model->activation_checkpointing();
  model->set_activation_checkpointing(options.micro.activation_checkpointing);
  absl::StatusOr<UpdateMetrics> metrics;
  // A task boundary of the worker: LibTorch reports failures (an allocation, a kernel) by
  // throwing, which must end the update with a status, not the process.
  try {
    metrics = Loop(model, optimizer, response_mask, attention_mask, options, micro_step);
  } catch (const c10::OutOfMemoryError& error) {
    RLOG(ERROR) << "update ran out of device memory: " << error.what_without_backtrace();
    metrics = absl::ResourceExhaustedError(absl::StrCat(
        "update ran out of device memory: ", std::string(error.what()).substr(0, 300),
        "; lower ppo_micro_batch_size_per_gpu or ppo_max_token_len_per_gpu, or turn on "
        "gradient_checkpointing"));
    optimizer.ZeroGrad();
  } catch (const std::exception& error) {
    RLOG(ERROR) << "update failed: " << std::string(error.what()).substr(0, 500);
    metrics = absl::InternalError(
        absl::StrCat("update failed: ", std::string(error.what()).substr(0, 500)));
    optimizer.ZeroGrad();
  }
  model->set_activation_checkpointing(checkpointing_before);
  return metrics;
}

}  // namespace rlhfd::train

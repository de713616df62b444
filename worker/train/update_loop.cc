// The shared update loop; see update_loop.h.
#include "worker/train/update_loop.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/metric_value.h"

namespace rlhfd::train {
namespace {

// Every replica must take the same optimiser steps (their collectives pair up): the same rows.
absl::Status CheckEqualRows(TrainedModel& model, int64_t rows) {
  std::vector<double> extremes = {static_cast<double>(rows), -static_cast<double>(rows)};
  RETURN_IF_ERROR(model.ReduceOverReplicas(extremes, ReplicaReduce::kMax));
  if (extremes[0] != -extremes[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the update's replicas hold different numbers of rows (", -extremes[1], " to ",
        extremes[0], "); every data-parallel rank needs the same share of the batch"));
  }
  return absl::OkStatus();
}

// The step's summed metric that is not finite, a loss (policy_loss, value_loss, ...) before the
// others (approx_kl, entropy, ...), which follow from it.
std::optional<std::string> FirstNonFiniteMetric(const UpdateMetrics& sums) {
  std::optional<std::string> found;
  for (const auto& [name, value] : sums) {
    if (std::isfinite(value)) continue;
    if (absl::EndsWith(name, "_loss")) return name;
    if (!found) found = name;
  }
  return found;
}

absl::StatusOr<UpdateMetrics> Loop(TrainedModel& model, const at::Tensor& response_mask,
                                   const at::Tensor& attention_mask,
                                   const UpdateLoopOptions& options, const MicroStep& micro_step) {
  const int64_t b = response_mask.size(0);
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(CheckEqualRows(model, b));
  // Real tokens per row (the token budget's unit) and response tokens per row, on the host.
  const at::Tensor real = attention_mask.defined()
                              ? attention_mask.sum(1).to(at::kLong).cpu()
                              : at::full({b}, response_mask.size(1) + 1, at::kLong);
  const std::vector<int64_t> tokens(real.data_ptr<int64_t>(), real.data_ptr<int64_t>() + b);
  const at::Tensor responses = response_mask.sum(1).to(at::kDouble).cpu();
  const double* response_tokens = responses.data_ptr<double>();
  double horizon = options.loss_horizon;
  if (horizon <= 0) {
    std::vector<double> longest = {b > 0 ? responses.max().item<double>() : 0.0};
    RETURN_IF_ERROR(model.ReduceOverReplicas(longest, ReplicaReduce::kMax));
    horizon = longest[0];
  }
  const double replicas = model.replicas();

  UpdateMetrics sums;
  double grad_norms = 0;
  int64_t optimizer_steps = 0, skips = 0;
  double trained_tokens = 0;
  const at::Generator generator = at::detail::createCPUGenerator(options.seed);
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    const int64_t group =
        options.shuffle_group > 1 && b % options.shuffle_group == 0 ? options.shuffle_group : 1;
    const at::Tensor order =
        (at::randperm(b / group, generator, at::TensorOptions().dtype(at::kLong)).unsqueeze(1) *
             group +
         at::arange(group, at::kLong).unsqueeze(0))
            .reshape({b})
            .contiguous();
    for (int64_t mini = 0; mini < b; mini += options.mini_batch) {
      const int64_t count = std::min(options.mini_batch, b - mini);
      const std::vector<int64_t> mini_rows(order.data_ptr<int64_t>() + mini,
                                           order.data_ptr<int64_t>() + mini + count);
      // The global mini-batch's denominators: this replica's rows and every other's.
      std::vector<double> counted = {0, 0};
      for (int64_t row : mini_rows) {
        counted[0] += response_tokens[row];
        counted[1] += response_tokens[row] > 0 ? 1 : 0;
      }
      RETURN_IF_ERROR(model.ReduceOverReplicas(counted, ReplicaReduce::kSum));
      const LossScale scale{.tokens = counted[0], .sequences = counted[1], .horizon = horizon};
      std::vector<std::vector<int64_t>> micro_batches = SplitMicroBatches(
          mini_rows, tokens, options.micro.micro_batch, options.micro.micro_batch_tokens, group);
      size_t real_micro_batches = micro_batches.size();
      if (model.lockstep_forwards()) {
        std::vector<double> most = {static_cast<double>(micro_batches.size())};
        RETURN_IF_ERROR(model.ReduceOverReplicas(most, ReplicaReduce::kMax));
        // The longest row: a packed forward of a row with fewer than two tokens runs no model,
        // and so none of the collectives the other replicas wait for.
        const int64_t longest =
            *std::max_element(mini_rows.begin(), mini_rows.end(),
                              [&](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
        while (micro_batches.size() < static_cast<size_t>(most[0])) {
          micro_batches.push_back({longest});
        }
      }
      model.ZeroGrad();
      RETURN_IF_ERROR(model.BeginStep());
      UpdateMetrics step_sums;  // this optimiser step's
      for (size_t k = 0; k < micro_batches.size(); ++k) {
        const std::vector<int64_t>& rows = micro_batches[k];
        const bool counts = k < real_micro_batches;
        double micro_tokens = 0;
        for (int64_t row : rows) micro_tokens += response_tokens[row];
        const MicroBatch micro{
            .rows = at::tensor(rows, at::kLong).to(response_mask.device()),
            .scale = scale,
            .token_share = counts && scale.tokens > 0 ? micro_tokens / scale.tokens : 0.0,
            .loss_weight = counts ? replicas : 0.0};
        RETURN_IF_ERROR(micro_step(micro, step_sums));
        RETURN_IF_ERROR(model.TakeStatus());
        if (counts) trained_tokens += micro_tokens;
      }
      const double lr = options.schedule != nullptr
                            ? options.schedule->At(options.first_optimizer_step + optimizer_steps)
                            : options.lr;
      ++optimizer_steps;
      const std::string where = absl::StrCat(options.role, ": optimizer step ", optimizer_steps,
                                             " of this update (epoch ", epoch + 1, ")");
      // The losses first, agreed by every replica before the step's collectives.
      const std::optional<std::string> bad_loss = FirstNonFiniteMetric(step_sums);
      std::vector<double> any_bad_loss = {bad_loss ? 1.0 : 0.0};
      RETURN_IF_ERROR(model.ReduceOverReplicas(any_bad_loss, ReplicaReduce::kMax));
      double norm = std::numeric_limits<double>::quiet_NaN();
      std::string non_finite;  // the tensor that went non-finite
      if (any_bad_loss[0] > 0) {
        model.ZeroGrad();
        non_finite = bad_loss ? absl::StrCat(*bad_loss, " is ", FormatMetric(step_sums[*bad_loss]))
                              : "the loss on another data-parallel rank is not finite";
      } else {
        ASSIGN_OR_RETURN(norm, model.FinishStep(lr, options.grad_clip));
        // The step wrote the parameters in place. Inside an autocast region (the roles' GPU
        // update) autocast keeps each float32 parameter's cast by tensor, not by value, for the
        // process: without this the next mini-batch would compute with the weights before the
        // step.
        at::autocast::clear_cache();
        if (!std::isfinite(norm)) {
          non_finite = absl::StrCat("grad_norm is ", FormatMetric(norm));
          if (!model.nonfinite_gradient().empty()) {
            absl::StrAppend(&non_finite, " (the backward went non-finite at ",
                            model.nonfinite_gradient(), ")");
          }
        }
      }
      if (!non_finite.empty()) {
        // No step was taken. Say whether the weights were already bad (a checkpoint with
        // non-finite values loaded, say), which no skipping can cure.
        ASSIGN_OR_RETURN(const std::optional<std::string> parameter, model.NonFiniteParameter());
        const int64_t skipped_in_run = options.nonfinite_skips_before + skips + 1;
        if (parameter || skipped_in_run > options.max_nonfinite_skips) {
          return absl::FailedPreconditionError(absl::StrCat(
              where, ": ", non_finite, "; no update was applied. ",
              parameter
                  ? absl::StrCat("Parameter ", *parameter,
                                 " already held non-finite values before this step (were "
                                 "they loaded from a damaged checkpoint?)")
                  : absl::StrCat("The parameters are finite; trainer.max_nonfinite_skips (",
                                 options.max_nonfinite_skips, ") allows no more skipped steps (",
                                 skipped_in_run - 1, " so far). Lower roles.", options.role,
                                 ".train.lr or grad_clip, check the rewards, or raise "
                                 "trainer.max_nonfinite_skips")));
        }
        ++skips;
        RLOG(WARNING) << where << ": " << non_finite << "; skipped the step (" << skipped_in_run
                      << " of trainer.max_nonfinite_skips " << options.max_nonfinite_skips << ")";
      } else {
        ASSIGN_OR_RETURN(const std::optional<std::string> parameter, model.NonFiniteParameter());
        if (parameter) {
          return absl::FailedPreconditionError(absl::StrCat(
              where, ": parameter ", *parameter, " holds non-finite values after the update (lr ",
              lr, ", grad_norm ", FormatMetric(norm), "): the step overflowed; lower roles.",
              options.role, ".train.lr. Nothing of this step is saved"));
        }
      }
      // A skipped step's metrics count as they are: its NaN shows in the step's means.
      for (const auto& [name, value] : step_sums) sums[name] += value;
      grad_norms += norm;
      sums["lr"] += lr;
    }
  }
  // Every replica added its share of each global mini-batch's metrics.
  std::vector<std::string> names;
  std::vector<double> values;
  for (const auto& [name, value] : sums) {
    names.push_back(name);
    values.push_back(name == "lr" ? value / replicas : value);
  }
  RETURN_IF_ERROR(model.ReduceOverReplicas(values, ReplicaReduce::kSum));
  UpdateMetrics metrics;
  const double steps = static_cast<double>(std::max<int64_t>(optimizer_steps, 1));
  for (size_t i = 0; i < names.size(); ++i) metrics[names[i]] = values[i] / steps;
  metrics["grad_norm"] = grad_norms / steps;
  if (optimizer_steps == 0) metrics["lr"] = options.lr;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics["optimizer_steps"] = static_cast<double>(optimizer_steps);
  metrics["nonfinite_skips"] = static_cast<double>(skips);
  metrics["response_tokens_per_s"] = trained_tokens / std::max(seconds, 1e-9);
  return metrics;
}

}  // namespace

absl::StatusOr<UpdateMetrics> RunUpdateLoop(TrainedModel& model, const at::Tensor& response_mask,
                                            const at::Tensor& attention_mask,
                                            const UpdateLoopOptions& options,
                                            const MicroStep& micro_step) {
  if (options.mini_batch < 1 || options.epochs < 1) {
    return absl::InvalidArgumentError("the update needs mini_batch >= 1 and epochs >= 1");
  }
  model::Transformer& module = model.module();
  const bool checkpointing_before = module->activation_checkpointing();
  module->set_activation_checkpointing(options.micro.activation_checkpointing);
  absl::StatusOr<UpdateMetrics> metrics;
  // A task boundary of the worker: LibTorch reports failures (an allocation, a kernel) by
  // throwing, which must end the update with a status, not the process.
  try {
    metrics = Loop(model, response_mask, attention_mask, options, micro_step);
  } catch (const c10::OutOfMemoryError& error) {
    RLOG(ERROR) << "update ran out of device memory: " << error.what_without_backtrace();
    metrics = absl::ResourceExhaustedError(absl::StrCat(
        "update ran out of device memory: ", std::string(error.what()).substr(0, 300),
        "; lower ppo_micro_batch_size_per_gpu or ppo_max_token_len_per_gpu, or turn on "
        "gradient_checkpointing"));
  } catch (const std::exception& error) {
    RLOG(ERROR) << "update failed: " << std::string(error.what()).substr(0, 500);
    metrics = absl::InternalError(
        absl::StrCat("update failed: ", std::string(error.what()).substr(0, 500)));
  }
  if (!metrics.ok()) model.ZeroGrad();
  module->set_activation_checkpointing(checkpointing_before);
  return metrics;
}

}  // namespace rlhfd::train

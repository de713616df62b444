#include "worker/roles/forward_passes.h"

#include <ATen/ATen.h>

#include <exception>

#include "absl/strings/str_cat.h"
#include "worker/train/batching.h"
#include "worker/train/chunked_log_probs.h"

namespace rlhfd::roles {
namespace {

// Runs `per_micro_batch(rows)` over consecutive micro-batches and concatenates the results; what
// LibTorch throws (out of memory, say) comes back as a status naming `what`.
template <typename Function>
absl::StatusOr<at::Tensor> InMicroBatches(int64_t rows, int64_t micro_batch, const char* what,
                                          Function per_micro_batch) {
  if (micro_batch < 1) return absl::InvalidArgumentError(absl::StrCat(what, ": micro-batch < 1"));
  try {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> parts;
    for (int64_t begin = 0; begin < rows; begin += micro_batch) {
      parts.push_back(per_micro_batch(begin, std::min(micro_batch, rows - begin)));
    }
    if (parts.empty()) return at::Tensor();
    return at::cat(parts);
  } catch (const c10::OutOfMemoryError& error) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " ran out of device memory; lower its log_prob_micro_batch_size_per_gpu (",
        micro_batch, ")"));
  } catch (const std::exception& error) {
    return absl::InternalError(
        absl::StrCat(what, " failed: ", std::string(error.what()).substr(0, 300)));
  }
}

}  // namespace

at::Tensor ToTrainingLayout(const at::Tensor& per_token, int64_t prompt_length) {
  return at::constant_pad_nd(per_token, {prompt_length - 1, 0});
}

absl::StatusOr<at::Tensor> ResponseLogProbs(model::Transformer& model, const at::Tensor& input_ids,
                                            const at::Tensor& attention_mask, int64_t prompt_length,
                                            int64_t micro_batch, double temperature) {
  const int64_t response_length = input_ids.size(1) - prompt_length;
  return InMicroBatches(
      input_ids.size(0), micro_batch, "log-probs", [&](int64_t begin, int64_t count) {
        const train::ScoredPositions scored = train::ForwardMicroBatch(
            model, input_ids.narrow(0, begin, count), attention_mask.narrow(0, begin, count),
            /*packed=*/false);
        const at::Tensor log_probs = scored.Unflatten(
            train::ChunkedLogProbs(train::TemperatureScaled(scored.hidden, temperature),
                                   model->HeadWeight(), scored.targets)
                .first);
        return log_probs.narrow(1, prompt_length - 1, response_length).to(at::kFloat) *
               attention_mask.narrow(0, begin, count).narrow(1, prompt_length, response_length);
      });
}

absl::StatusOr<at::Tensor> ResponseValues(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask, int64_t prompt_length,
                                          int64_t micro_batch) {
  const int64_t response_length = input_ids.size(1) - prompt_length;
  return InMicroBatches(
      input_ids.size(0), micro_batch, "values", [&](int64_t begin, int64_t count) {
        const train::ScoredPositions scored = train::ForwardMicroBatch(
            model, input_ids.narrow(0, begin, count), attention_mask.narrow(0, begin, count),
            /*packed=*/false);
        const at::Tensor values = scored.Unflatten(model->Scores(scored.hidden).squeeze(-1));
        return values.narrow(1, prompt_length - 1, response_length).to(at::kFloat) *
               attention_mask.narrow(0, begin, count).narrow(1, prompt_length, response_length);
      });
}

absl::StatusOr<at::Tensor> SequenceScores(model::Transformer& model, const at::Tensor& input_ids,
                                          const at::Tensor& attention_mask, int64_t micro_batch) {
  return InMicroBatches(
      input_ids.size(0), micro_batch, "reward scores", [&](int64_t begin, int64_t count) {
        const at::Tensor mask = attention_mask.narrow(0, begin, count);
        const at::Tensor hidden =
            model->Hidden({.input_ids = input_ids.narrow(0, begin, count), .attention_mask = mask});
        // The last real token: the largest position whose mask is 1.
        const at::Tensor positions = at::arange(mask.size(1), mask.options()).unsqueeze(0);
        const at::Tensor last = (positions * mask).argmax(1);
        const at::Tensor picked =
            hidden.index({at::arange(count, last.options()), last});  // (count, C)
        return model->Scores(picked).select(-1, 0).to(at::kFloat);
      });
}

}  // namespace rlhfd::roles

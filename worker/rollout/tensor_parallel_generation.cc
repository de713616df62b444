#include "worker/rollout/tensor_parallel_generation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/rollout/request_check.h"
#include "worker/rollout/sampler.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout {
namespace {

// A rank's requests as int64 words (doubles bit for bit), for gathering over a group.
void AppendRequests(const std::vector<GenerationRequest>& requests, std::vector<int64_t>& words) {
  words.push_back(static_cast<int64_t>(requests.size()));
  for (const GenerationRequest& request : requests) {
    const SamplingParams& s = request.sampling;
    words.insert(words.end(),
                 {static_cast<int64_t>(s.seed.value_or(0)), std::bit_cast<int64_t>(s.temperature),
                  s.top_k, std::bit_cast<int64_t>(s.top_p), s.max_new_tokens, s.n,
                  s.ignore_eos ? 1 : 0, static_cast<int64_t>(s.stop_token_ids.size()),
                  static_cast<int64_t>(request.prompt_ids.size())});
    words.insert(words.end(), s.stop_token_ids.begin(), s.stop_token_ids.end());
    words.insert(words.end(), request.prompt_ids.begin(), request.prompt_ids.end());
  }
}

// The inverse of AppendRequests: appends one rank's requests to `requests`.
void ReadRequests(const int64_t* words, std::vector<GenerationRequest>& requests) {
  const int64_t count = *words++;
  for (int64_t i = 0; i < count; ++i) {
    GenerationRequest request;
    SamplingParams& s = request.sampling;
    s.seed = static_cast<uint64_t>(words[0]);
    s.temperature = std::bit_cast<double>(words[1]);
    s.top_k = words[2];
    s.top_p = std::bit_cast<double>(words[3]);
    s.max_new_tokens = words[4];
    s.n = words[5];
    s.ignore_eos = words[6] != 0;
    const int64_t stops = words[7], length = words[8];
    words += 9;
    s.stop_token_ids.assign(words, words + stops);
    words += stops;
    request.prompt_ids.assign(words, words + length);
    words += length;
    requests.push_back(std::move(request));
  }
}

struct Row {
  size_t request = 0;
  std::vector<int64_t> tokens;  // prompt, then the response so far
  int64_t prompt_length = 0;
  uint64_t seed = 0;
  Completion completion;
};

absl::Status CheckRequests(const std::vector<GenerationRequest>& requests, int64_t vocab_size) {
  for (size_t i = 0; i < requests.size(); ++i) {
    // No KV cache, so no max_model_len of its own.
    RETURN_IF_ERROR(CheckGenerationRequest(requests[i], i, vocab_size, std::nullopt));
    // The ranks must draw alike: no seed from a per-rank sequence.
    if (!requests[i].sampling.seed) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": needs a seed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<GenerationResult>> GenerateTensorParallel(
    parallel::TensorParallelTransformer& model, const std::vector<GenerationRequest>& requests,
    const std::vector<int64_t>& eos_token_ids, int64_t vocab_size) {
  RETURN_IF_ERROR(CheckRequests(requests, vocab_size));
  std::vector<Row> rows;
  bool filters = false;
  for (size_t r = 0; r < requests.size(); ++r) {
    const SamplingParams& sampling = requests[r].sampling;
    filters |= sampling.top_k > 0 || sampling.top_p < 1;
    for (int64_t j = 0; j < sampling.n; ++j) {
      Row row;
      row.request = r;
      row.tokens = requests[r].prompt_ids;
      row.prompt_length = static_cast<int64_t>(row.tokens.size());
      // As GenerationEngine seeds sample j of a request.
      row.seed = SampleSeed(*sampling.seed, static_cast<uint64_t>(j));
      rows.push_back(std::move(row));
    }
  }
  std::vector<size_t> active(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) active[i] = i;
  while (!active.empty()) {
    const int64_t batch = static_cast<int64_t>(active.size());
    int64_t longest = 0;
    for (const size_t i : active) longest = std::max<int64_t>(longest, rows[i].tokens.size());
    // Right-padded: causal attention keeps each row's real tokens from seeing the padding.
    at::Tensor ids = at::zeros({batch, longest}, at::kLong);
    at::Tensor last = at::empty({batch}, at::kLong);
    at::Tensor temperature = at::empty({batch}, at::kFloat);
    at::Tensor seeds = at::empty({batch}, at::kLong), counters = at::empty({batch}, at::kLong);
    at::Tensor top_k = at::empty({batch}, at::kLong), top_p = at::empty({batch}, at::kFloat);
    for (int64_t b = 0; b < batch; ++b) {
      const Row& row = rows[active[b]];
      const SamplingParams& sampling = requests[row.request].sampling;
      const int64_t length = static_cast<int64_t>(row.tokens.size());
      std::copy(row.tokens.begin(), row.tokens.end(), ids.data_ptr<int64_t>() + b * longest);
      last.data_ptr<int64_t>()[b] = length - 1;
      temperature.data_ptr<float>()[b] = static_cast<float>(sampling.temperature);
      seeds.data_ptr<int64_t>()[b] = static_cast<int64_t>(row.seed);
      counters.data_ptr<int64_t>()[b] = length - row.prompt_length;
      top_k.data_ptr<int64_t>()[b] = sampling.top_k;
      top_p.data_ptr<float>()[b] = static_cast<float>(sampling.top_p);
    }
    at::NoGradGuard no_grad;
    const at::Device device = model.device();
    ASSIGN_OR_RETURN(const at::Tensor hidden, model.Hidden(ids.to(device)));
    const at::Tensor at_last =
        hidden
            .index(
                {at::arange(batch, at::TensorOptions(at::kLong).device(device)), last.to(device)})
            .unsqueeze(1);
    ASSIGN_OR_RETURN(const at::Tensor logits, model.Logits(at_last));
    SamplingRows sampling_rows{temperature, seeds, counters};
    if (filters) {
      sampling_rows.top_k = top_k;
      sampling_rows.top_p = top_p;
    }
    const SampledTokens drawn = SampleTokens(logits.squeeze(1).cpu(), sampling_rows);
    const at::Tensor tokens = drawn.tokens.cpu(), logprobs = drawn.logprobs.cpu();
    std::vector<size_t> still;
    for (int64_t b = 0; b < batch; ++b) {
      Row& row = rows[active[b]];
      const SamplingParams& sampling = requests[row.request].sampling;
      const int64_t token = tokens.data_ptr<int64_t>()[b];
      row.tokens.push_back(token);
      row.completion.token_ids.push_back(token);
      row.completion.logprobs.push_back(logprobs.data_ptr<float>()[b]);
      row.completion.response_mask.push_back(1);
      const std::optional<FinishReason> finish = FinishWith(
          sampling, eos_token_ids, token, static_cast<int64_t>(row.completion.token_ids.size()));
      if (finish) {
        row.completion.finish_reason = *finish;
      } else {
        still.push_back(active[b]);
      }
    }
    active = std::move(still);
  }
  std::vector<GenerationResult> results(requests.size());
  for (Row& row : rows) results[row.request].samples.push_back(std::move(row.completion));
  return results;
}

absl::StatusOr<GroupRequests> GatherGroupRequests(parallel::Communicator& group,
                                                  const std::vector<GenerationRequest>& requests,
                                                  const at::Device& device) {
  std::vector<int64_t> mine;
  AppendRequests(requests, mine);
  const auto on_device = at::TensorOptions(at::kLong).device(device);
  const at::Tensor size = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong).to(device);
  const at::Tensor sizes = at::empty({group.size()}, on_device);
  RETURN_IF_ERROR(group.AllGather(size, sizes));
  const int64_t longest = sizes.max().item<int64_t>();
  at::Tensor padded = at::zeros({1, longest}, at::kLong);
  std::copy(mine.begin(), mine.end(), padded.data_ptr<int64_t>());
  const at::Tensor gathered_words = at::empty({group.size(), longest}, on_device);
  RETURN_IF_ERROR(group.AllGather(padded.to(device), gathered_words));
  const at::Tensor everyone = gathered_words.cpu();
  GroupRequests gathered;
  for (int r = 0; r < group.size(); ++r) {
    if (r == group.rank()) gathered.first = gathered.all.size();
    ReadRequests(everyone[r].data_ptr<int64_t>(), gathered.all);
  }
  return gathered;
}

}  // namespace rlhfd::rollout

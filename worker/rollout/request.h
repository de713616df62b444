// What a caller asks the generation engine for, and what it gets back.
#pragma once

#include <algorithm>
#include <cstdint>
#include <future>
#include <optional>
#include <string_view>
#include <vector>

namespace rlhfd::rollout {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy (argmax).
  int64_t top_k = 0;         // Keep the k most likely tokens; 0 = all.
  double top_p = 1.0;        // Keep the smallest set of top tokens with this much mass; 1 = all.
  // Same seed, same prompt, same parameters: same output, whatever else shares the batch. Unset:
  // drawn from the engine's seed sequence.
  std::optional<uint64_t> seed;
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_token_ids;  // Besides EOS; the stop token ends the response.
  bool ignore_eos = false;              // Run to max_new_tokens (benchmarks).
  int64_t n = 1;                        // Samples per prompt, sharing the prompt's prefill.
};

enum class FinishReason {
  kStop,         // EOS or a stop token (kept in the output)
  kLength,       // max_new_tokens
  kInterrupted,  // not finished: the call was interrupted (partial rollouts)
};

constexpr std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kInterrupted:
      return "interrupted";
  }
  return "length";
}

struct Completion {
  std::vector<int64_t> token_ids;
  // Log-probability of each token under the distribution it was drawn from: softmax of the
  // logits over temperature, restricted to the top-k / top-p set (plain softmax for greedy); 0
  // for an inserted token.
  std::vector<float> logprobs;
  // verl's response_mask: 1 for each token the model sampled, 0 for each a TurnHandler inserted
  // (a tool's response, the next turn's header), which the model reads but did not choose.
  std::vector<uint8_t> response_mask;
  FinishReason finish_reason = FinishReason::kLength;
};

// What follows a sample's stop in a multi-turn rollout: the end of the sample, or the tokens to
// insert after its stop token before it samples again.
struct TurnOutcome {
  bool finish = true;
  std::vector<int64_t> inserted;  // with finish = false: at least one token
};

// Multi-turn rollouts: told when a sample stops (EOS or a stop token, not the length limit), it
// decides whether the sample goes on. The engine calls OnStop on its own thread, and must get
// back at once: the work of the next turn (running a tool) belongs in the returned future, which
// the engine polls while the other samples keep decoding. A future that throws ends its sample.
class TurnHandler {
 public:
  virtual ~TurnHandler() = default;
  // Sample `sample` of request `request` stopped with `completion` so far (its last token the
  // stop token).
  virtual std::future<TurnOutcome> OnStop(size_t request, int64_t sample,
                                          const Completion& completion) = 0;
};

// Whether a response ends with `token`, its `length`-th: at EOS (unless ignore_eos) or a stop
// token (kStop, the token kept), or at max_new_tokens (kLength). The one rule of every decoder.
inline std::optional<FinishReason> FinishWith(const SamplingParams& sampling,
                                              const std::vector<int64_t>& eos_token_ids,
                                              int64_t token, int64_t length) {
  const auto holds = [token](const std::vector<int64_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if ((!sampling.ignore_eos && holds(eos_token_ids)) || holds(sampling.stop_token_ids)) {
    return FinishReason::kStop;
  }
  if (length >= sampling.max_new_tokens) return FinishReason::kLength;
  return std::nullopt;
}

struct GenerationRequest {
  std::vector<int64_t> prompt_ids;
  SamplingParams sampling;
  // Partial rollouts (n must be 1): the sample goes on from these tokens, prefilled after the
  // prompt, drawing with sampling.seed as its own seed (SampleSeed of its first request's seed and
  // its index): with the same logits it draws what it would have drawn uninterrupted.
  std::optional<Completion> resumed;
};

// One per request, in request order; `samples` has n entries.
struct GenerationResult {
  std::vector<Completion> samples;
};

}  // namespace rlhfd::rollout

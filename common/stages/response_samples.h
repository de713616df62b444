// Logged responses (trainer.log_samples, v1::ResponseSample): how many a step may log and how
// long a text may be, for the validator, the worker stages that fill them and the controller
// that keeps them. Bounded so that a step's record stays small in the history and the logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/util/text.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::stages {

// trainer.log_samples' upper bound.
inline constexpr int32_t kMaxLogSamples = 64;
// A prompt or response longer than this is cut (at a UTF-8 boundary) and marked truncated.
inline constexpr size_t kMaxSampleTextBytes = 2000;

// `text` as a proto string may hold it: invalid UTF-8 (a decode that ends inside a character)
// becomes U+FFFD, and the result is cut to kMaxSampleTextBytes; `truncated` says whether it was.
inline std::string SampleText(absl::string_view text, bool& truncated) {
  std::string valid;
  while (!text.empty()) {
    const size_t bad = FirstInvalidUtf8(text);
    if (bad == absl::string_view::npos) {
      valid.append(text.data(), text.size());
      break;
    }
    valid.append(text.data(), bad);
    valid += "\xEF\xBF\xBD";
    text.remove_prefix(bad + 1);
  }
  const absl::string_view kept = TruncateUtf8(valid, kMaxSampleTextBytes);
  truncated = kept.size() < valid.size();
  return std::string(kept);
}

// A sample of row `row`: its texts bounded as above.
inline v1::ResponseSample MakeResponseSample(int64_t row, absl::string_view prompt,
                                             absl::string_view response, double score,
                                             bool validation) {
  v1::ResponseSample sample;
  bool cut = false;
  sample.set_row(row);
  sample.set_prompt(SampleText(prompt, cut));
  sample.set_prompt_truncated(cut);
  sample.set_response(SampleText(response, cut));
  sample.set_response_truncated(cut);
  sample.set_score(score);
  sample.set_validation(validation);
  return sample;
}

// Appends `from` (a rank's samples, in row order) to `into` while it holds fewer than `limit`
// (trainer.log_samples): no more than asked for, and no longer, whatever a peer sends.
inline void AppendSamples(const google::protobuf::RepeatedPtrField<v1::ResponseSample>& from,
                          int64_t limit, std::vector<v1::ResponseSample>& into) {
  for (const v1::ResponseSample& sample : from) {
    if (static_cast<int64_t>(into.size()) >= limit) return;
    v1::ResponseSample bounded = MakeResponseSample(
        sample.row(), sample.prompt(), sample.response(), sample.score(), sample.validation());
    bounded.set_prompt_truncated(bounded.prompt_truncated() || sample.prompt_truncated());
    bounded.set_response_truncated(bounded.response_truncated() || sample.response_truncated());
    into.push_back(std::move(bounded));
  }
}

}  // namespace rlhfd::stages

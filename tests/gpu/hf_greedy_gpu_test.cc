// [gpu] The rollout engine in bf16 on the GPU against transformers' greedy generate in bf16 on
// the same GPU (references from tests/gpu/make_hf_bf16_greedy.py, named by
// $RLHFD_HF_BF16_GREEDY): the committed fixtures (the engine's module path) and two models
// shaped for the fused decoder with CUDA graphs (head dims 64 and 128).
//
// Two bf16 computations round differently (transformers keeps the residual stream and the
// logits in bf16; rlhfd keeps them in float32), so both are measured against the float32 model
// on the same tokens. Checked: along the tokens both chose, rlhfd's log-probs are no further from
// float32 than transformers' bf16 ones (x1.5 + 0.01); where the two part, it is at a tie for
// bf16 — rlhfd's token is in float32's top 5 there, and float32 separates the two by less than
// the bf16 error seen on that model (x2 + 0.01). The figures are printed for
// docs/operations.md. Without the references the test is reported skipped.
#include <ATen/ATen.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "common/util/files.h"
#include "tests/support/gpu_skip.h"
#include "worker/model/model_loader.h"
#include "worker/rollout/engine.h"

namespace rlhfd::rollout {

TEST_CASE("bf16 greedy generation equals transformers' bf16 greedy generate", "[gpu][rollout]") {
  const char* path = std::getenv("RLHFD_HF_BF16_GREEDY");
  if (path == nullptr) {
    testing::ReportSkipped(
        "set RLHFD_HF_BF16_GREEDY to the output of tests/gpu/make_hf_bf16_greedy.py");
    return;
  }
  auto text = ReadFileToString(path);
  REQUIRE(text.ok());
  const nlohmann::json references = nlohmann::json::parse(*text);
  const int64_t max_new_tokens = references["max_new_tokens"];
  std::cout << absl::StrFormat("%-18s %5s %5s %4s %10s %10s %10s  %s\n", "model", "cases", "equal",
                               "ties", "hf-fp32", "ours-fp32", "ours-hf", "ties: fp32 gap@step");
  for (const auto& reference : references["transformers_greedy_bf16"]) {
    const std::string dir = reference["model"];
    INFO(dir);
    model::LoadOptions options{at::kBFloat16, at::Device(at::kCUDA, 0), model::HeadNeed::kCausalLm};
    options.max_sequence_length = 1024;
    auto model = model::LoadModel(dir, options);
    REQUIRE(model.ok());
    EngineOptions engine_options;
    engine_options.max_model_len = 256;
    auto engine = GenerationEngine::Create(*model, engine_options);
    REQUIRE(engine.ok());
    std::vector<GenerationRequest> requests;
    for (const auto& c : reference["cases"]) {
      GenerationRequest request{c["prompt"].get<std::vector<int64_t>>(), {}};
      request.sampling.temperature = 0;
      request.sampling.max_new_tokens = max_new_tokens;
      requests.push_back(std::move(request));
    }
    auto results = (*engine)->Generate(requests);
    REQUIRE(results.ok());
    int equal = 0, ties = 0;
    double hf_error = 0, our_error = 0, apart = 0;  // Largest differences over the model.
    std::vector<double> tie_gaps;
    std::string gaps;
    for (size_t i = 0; i < requests.size(); ++i) {
      INFO("prompt " << i);
      const auto& c = reference["cases"][i];
      const auto expected = c["output"].get<std::vector<int64_t>>();
      const auto& ours = (*results)[i].samples[0];
      size_t shared = 0;
      while (shared < expected.size() && shared < ours.token_ids.size() &&
             expected[shared] == ours.token_ids[shared]) {
        ++shared;
      }
      double case_hf = 0, case_ours = 0;
      for (size_t t = 0; t < shared; ++t) {
        const double exact = c["logprobs_fp32"][t];
        case_hf = std::max(case_hf, std::abs(c["logprobs"][t].get<double>() - exact));
        case_ours = std::max(case_ours, std::abs(ours.logprobs[t] - exact));
        apart = std::max(apart, std::abs(ours.logprobs[t] - c["logprobs"][t].get<double>()));
      }
      CHECK(case_ours <= 1.5 * case_hf + 0.01);
      hf_error = std::max(hf_error, case_hf);
      our_error = std::max(our_error, case_ours);
      if (shared == expected.size() && shared == ours.token_ids.size()) {
        ++equal;
        continue;
      }
      REQUIRE(shared < expected.size());
      REQUIRE(shared < ours.token_ids.size());
      double theirs_exact = 0, ours_exact = 1;  // ours_exact stays 1 (impossible) if not in top 5
      for (const auto& [token, logprob] :
           c["top5_fp32"][shared].get<std::vector<std::pair<int64_t, double>>>()) {
        if (token == expected[shared]) theirs_exact = logprob;
        if (token == ours.token_ids[shared]) ours_exact = logprob;
      }
      const double gap = std::abs(theirs_exact - ours_exact);
      INFO("parted at step " << shared << ": transformers " << expected[shared] << ", ours "
                             << ours.token_ids[shared] << "; float32 separates them by " << gap);
      CHECK(ours_exact <= 0);
      tie_gaps.push_back(gap);
      ++ties;
      absl::StrAppendFormat(&gaps, "%s%.3f@%d", gaps.empty() ? "" : " ", gap, shared);
    }
    // Judged once the model's bf16 error is known (a case may part at its first token).
    for (const double gap : tie_gaps) CHECK(gap <= 2 * std::max(hf_error, our_error) + 0.01);
    const std::string name = dir.substr(dir.rfind('/') + 1);
    std::cout << absl::StrFormat("%-18s %5d %5d %4d %10.4f %10.4f %10.4f  %s\n", name,
                                 requests.size(), equal, ties, hf_error, our_error, apart,
                                 gaps.empty() ? "-" : gaps);
  }
}

}  // namespace rlhfd::rollout

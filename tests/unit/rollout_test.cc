// The generation engine on CPU (fp32): greedy output against transformers' generate, sampling
// statistics, top-k / top-p sets, seeds, continuous batching, shared prefills, log-probs against
// a full forward, stop conditions and bad requests.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/types.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "worker/model/model_loader.h"
#include "worker/rollout/block_pool.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/sampler.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout {
namespace {

const std::string kModels = std::string(RLHFD_FIXTURES_DIR) + "/models/";

model::Transformer Load(const std::string& name) {
  auto model = model::LoadModel(kModels + name, {});
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  return *model;
}

std::unique_ptr<GenerationEngine> MakeEngine(model::Transformer model, EngineOptions options = {}) {
  if (options.max_model_len == 0) options.max_model_len = 64;
  auto engine = GenerationEngine::Create(std::move(model), options);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  return std::move(*engine);
}

std::vector<GenerationResult> MustGenerate(GenerationEngine& engine,
                                           const std::vector<GenerationRequest>& requests) {
  auto results = engine.Generate(requests);
  INFO(results.status().ToString());
  REQUIRE(results.ok());
  REQUIRE(results->size() == requests.size());
  return std::move(*results);
}

GenerationRequest Greedy(std::vector<int64_t> prompt, int64_t max_new_tokens) {
  GenerationRequest request{std::move(prompt), {}};
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = max_new_tokens;
  return request;
}

std::vector<int64_t> Prompt(int64_t length, int64_t offset) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < length; ++i) ids.push_back(3 + (offset * 37 + i * 101) % 500);
  return ids;
}

// Pearson's statistic of `counts` against probabilities `p` (cells with p > 0).
double ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t total) {
  double statistic = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (p[i] == 0) continue;
    const double expected = p[i] * static_cast<double>(total);
    statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return statistic;
}

// Draws `draws` tokens from one row of logits with one seed and counters 0..draws-1.
std::vector<int64_t> Histogram(const at::Tensor& row, double temperature, int64_t top_k,
                               double top_p, int64_t draws, int64_t seed) {
  const int64_t vocab = row.size(0);
  SamplingRows rows{at::full({draws}, temperature, at::kFloat), at::full({draws}, seed, at::kLong),
                    at::arange(draws, at::kLong)};
  if (top_k > 0 || top_p < 1) {
    rows.top_k = at::full({draws}, top_k, at::kLong);
    rows.top_p = at::full({draws}, top_p, at::kFloat);
  }
  const SampledTokens drawn = SampleTokens(row.unsqueeze(0).expand({draws, vocab}), rows);
  std::vector<int64_t> counts(vocab, 0);
  for (int64_t i = 0; i < draws; ++i) counts[drawn.tokens[i].item<int64_t>()] += 1;
  return counts;
}

// Each sample of `results` against the model's own forward over its prompt and response, without
// a cache: each token's log-probability under softmax(logits / T) within 1e-4, and a greedy
// row's tokens the argmax.
void CheckAgainstUncachedForward(model::Transformer& model,
                                 const std::vector<GenerationRequest>& requests,
                                 const std::vector<GenerationResult>& results) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const SamplingParams& sampling = requests[i].sampling;
    for (const Completion& sample : results[i].samples) {
      INFO("request " << i << " against the uncached forward");
      std::vector<int64_t> ids = requests[i].prompt_ids;
      ids.insert(ids.end(), sample.token_ids.begin(), sample.token_ids.end());
      at::Tensor logits;
      {
        c10::InferenceMode inference;
        const at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
        logits = model->Logits(model->Hidden(model::ForwardBatch{input, at::Tensor()}))
                     .squeeze(0)
                     .to(at::kDouble);
      }
      const int64_t p = static_cast<int64_t>(requests[i].prompt_ids.size());
      const double temperature = sampling.temperature > 0 ? sampling.temperature : 1.0;
      const at::Tensor log_probs = at::log_softmax(logits / temperature, -1);
      REQUIRE(sample.logprobs.size() == sample.token_ids.size());
      for (size_t t = 0; t < sample.token_ids.size(); ++t) {
        const at::Tensor row = log_probs[p - 1 + static_cast<int64_t>(t)];
        CHECK(sample.logprobs[t] == Approx(row[sample.token_ids[t]].item<double>()).margin(1e-4));
        if (sampling.temperature == 0) CHECK(row.argmax().item<int64_t>() == sample.token_ids[t]);
      }
    }
  }
}

}  // namespace

TEST_CASE("greedy generation equals transformers' greedy generate (CPU, fp32)", "[rollout]") {
  for (const std::string name :
       {"tiny-llama", "tiny-llama3-rope", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"}) {
    INFO(name);
    std::ifstream file(kModels + name + "/generate_golden.json");
    const nlohmann::json golden = nlohmann::json::parse(file);
    model::Transformer model = Load(name);
    CHECK(model->config().eos_token_ids == golden["eos_token_id"].get<std::vector<int64_t>>());
    auto engine = MakeEngine(model);
    std::vector<GenerationRequest> requests;
    for (const auto& c : golden["cases"]) {
      requests.push_back(
          Greedy(c["prompt"].get<std::vector<int64_t>>(), golden["max_new_tokens"].get<int64_t>()));
    }
    const auto results = MustGenerate(*engine, requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      INFO("prompt " << i);
      const Completion& sample = results[i].samples[0];
      CHECK(sample.token_ids == golden["cases"][i]["output"].get<std::vector<int64_t>>());
      // And each token's log-probability, as transformers computes it.
      const auto expected = golden["cases"][i]["logprobs"].get<std::vector<double>>();
      REQUIRE(sample.logprobs.size() == expected.size());
      for (size_t j = 0; j < expected.size(); ++j) {
        CHECK(sample.logprobs[j] == Approx(expected[j]).margin(1e-4));
      }
    }
  }
}

// log-softmax(z / T) of `chosen` after top-k then top-p (the mass of the tokens ranked above a
// token, renormalised over the top-k, must be < top_p for it to stay), in double precision with
// plain loops: the reference the sampler's log-probs are checked against.
double FilteredLogProb(std::vector<double> z, int64_t chosen, double temperature, int64_t top_k,
                       double top_p) {
  for (double& v : z) v /= temperature;
  std::vector<size_t> order(z.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
  const size_t k = top_k > 0 ? static_cast<size_t>(top_k) : z.size();
  double top_k_sum = 0;
  for (size_t r = 0; r < k; ++r) top_k_sum += std::exp(z[order[r]] - z[order[0]]);
  std::vector<bool> kept(z.size(), false);
  double above = 0;
  for (size_t r = 0; r < k; ++r) {
    const double p = std::exp(z[order[r]] - z[order[0]]) / top_k_sum;
    if (r > 0 && above >= top_p) break;
    kept[order[r]] = true;
    above += p;
  }
  REQUIRE(kept[chosen]);
  double sum = 0;
  for (size_t v = 0; v < z.size(); ++v) {
    if (kept[v]) sum += std::exp(z[v] - z[order[0]]);
  }
  return z[chosen] - z[order[0]] - std::log(sum);
}

TEST_CASE("sampled log-probs are those of the filtered distribution", "[rollout]") {
  // Greedy log-probs are checked against transformers above. For a sampled response the
  // reference is the model's own logits (equal to transformers' within 1e-5, model_test) with
  // temperature, top-k and top-p applied by FilteredLogProb.
  torch::NoGradGuard no_grad;
  model::Transformer model = Load("tiny-qwen2");
  auto engine = MakeEngine(model);
  GenerationRequest sampled{Prompt(9, 2), {}};
  sampled.sampling.temperature = 0.7;
  sampled.sampling.top_k = 40;
  sampled.sampling.top_p = 0.9;
  sampled.sampling.seed = 5;
  sampled.sampling.max_new_tokens = 10;
  sampled.sampling.ignore_eos = true;
  const Completion completion = MustGenerate(*engine, {sampled})[0].samples[0];
  std::vector<int64_t> ids = sampled.prompt_ids;
  ids.insert(ids.end(), completion.token_ids.begin(), completion.token_ids.end());
  const int64_t prompt = static_cast<int64_t>(sampled.prompt_ids.size());
  const at::Tensor logits =
      model->Logits(model->Hidden({at::tensor(ids).unsqueeze(0)}))[0].to(at::kDouble);
  REQUIRE(completion.logprobs.size() == completion.token_ids.size());
  for (size_t i = 0; i < completion.token_ids.size(); ++i) {
    INFO("token " << i);
    const at::Tensor row = logits[prompt - 1 + static_cast<int64_t>(i)].contiguous();
    const std::vector<double> z(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
    const double expected = FilteredLogProb(z, completion.token_ids[i], sampled.sampling.temperature,
                                            sampled.sampling.top_k, sampled.sampling.top_p);
    CHECK(completion.logprobs[i] == Approx(expected).margin(1e-4));
  }
}

TEST_CASE("sampled tokens follow softmax(logits / T): chi-square", "[rollout]") {
  const at::Tensor logits = at::tensor({1.5f, 0.2f, -0.7f, 2.1f, 0.0f, -2.0f, 1.0f, 0.4f});
  const int64_t draws = 40000;
  const double temperature = 0.8;
  const auto counts = Histogram(logits, temperature, 0, 1.0, draws, /*seed=*/1234);
  const at::Tensor p = at::softmax(logits.to(at::kDouble) / temperature, 0);
  std::vector<double> probs(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
  // 7 degrees of freedom: the 0.1% critical value is 24.32.
  CHECK(ChiSquare(counts, probs, draws) < 24.32);
  // Greedy (temperature 0) is the argmax every time.
  const auto greedy = Histogram(logits, 0.0, 0, 1.0, 100, 1);
  CHECK(greedy[3] == 100);
}

// Every one of the 2^24 random values gives a finite, positive exponential draw, decreasing in
// the bits, from -log(1 - 2^-25) to -log(2^-25): none rounds to u = 1, whose infinite Gumbel
// draw would pick a token whatever its probability.
TEST_CASE("the sampler's exponential draws are finite and positive for every random value",
          "[rollout]") {
  float previous = std::numeric_limits<float>::infinity();
  int64_t bad = 0, unordered = 0;
  for (uint32_t bits = 0; bits < (1u << 24); ++bits) {
    const float e = ExponentialFromBits(bits);
    bad += !(std::isfinite(e) && e > 0);
    unordered += !(e < previous);
    previous = e;
  }
  CHECK(bad == 0);
  CHECK(unordered == 0);
  CHECK(ExponentialFromBits(0) == Approx(-std::log(0.5 / 16777216.0)).epsilon(1e-6));
  CHECK(ExponentialFromBits((1u << 24) - 1) == Approx(0.5 / 16777216.0).epsilon(1e-6));
}

// The sampling kernel skips the noise of a logit whose logit plus GumbelUpperBound (or plus
// kGumbelMax) is below the best draw so far: exact only if the bounds are above every draw. All
// 2^24 random values, with a margin of 1e-4 for the device's faster outer logarithm (within a few
// float ulps of the host's); and the bound tight where the draws that win lie (u within 2^-9 of
// 1: G above 6.2).
TEST_CASE("the sampler's Gumbel bounds are above every draw", "[rollout]") {
  int64_t violations = 0, loose = 0;
  float largest = -std::numeric_limits<float>::infinity();
  for (uint32_t bits = 0; bits < (1u << 24); ++bits) {
    const float g = GumbelFromBits(bits), bound = GumbelUpperBound(bits);
    violations += !(g + 1e-4f < bound);
    loose += bits >= (1u << 24) - (1u << 15) && bound - g > 2.5e-3f;
    largest = std::max(largest, g);
  }
  CHECK(violations == 0);
  CHECK(loose == 0);
  CHECK(largest + 1e-4f < kGumbelMax);
  CHECK(largest > 17.f);
}

// A Qwen-sized vocabulary (151,936) with three plausible tokens and the rest 30 nats below: a
// draw from the tail has probability about 151,936 e^-30 = 1.4e-8, so 2,000 draws must never
// take one. (A Gumbel draw that rounded to infinity took a uniformly random token in about 0.9 %
// of draws over this vocabulary: some 18 of these.)
TEST_CASE("a large vocabulary's improbable tail is not drawn", "[rollout]") {
  const int64_t vocab = 151936, draws = 2000;
  at::Tensor logits = at::full({vocab}, -30.0f, at::kFloat);
  logits[17] = 0.0f;
  logits[4242] = -1.0f;
  logits[99000] = -2.0f;
  const auto counts = Histogram(logits, 1.0, 0, 1.0, draws, /*seed=*/77);
  CHECK(counts[17] + counts[4242] + counts[99000] == draws);
  // And the three in their proportions (2 degrees of freedom: 0.1% critical value 13.82).
  const at::Tensor p = at::softmax(logits.to(at::kDouble), 0);
  std::vector<double> probs(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
  for (double& q : probs) q = q > 1e-6 ? q : 0.0;
  CHECK(ChiSquare(counts, probs, draws) < 13.82);
}

TEST_CASE("top-k and top-p keep exactly the right tokens", "[rollout]") {
  // Probabilities 0.40, 0.25, 0.15, 0.10, 0.06, 0.04 (ranked), shuffled over the vocabulary.
  const std::vector<double> ranked = {0.40, 0.25, 0.15, 0.10, 0.06, 0.04};
  const std::vector<int64_t> where = {4, 0, 5, 2, 1, 3};  // Vocabulary id of each rank.
  at::Tensor logits = at::empty({6});
  for (size_t i = 0; i < ranked.size(); ++i) logits[where[i]] = std::log(ranked[i]);
  const auto kept = [&](int64_t top_k, double top_p) {
    const at::Tensor filtered =
        FilterTopKTopP(logits.unsqueeze(0), at::ones({1}), at::full({1}, top_k, at::kLong),
                       at::full({1}, top_p, at::kFloat))[0];
    std::set<int64_t> ids;
    for (int64_t v = 0; v < 6; ++v) {
      if (filtered[v].item<float>() != -INFINITY) ids.insert(v);
    }
    return ids;
  };
  CHECK(kept(3, 1.0) == std::set<int64_t>{4, 0, 5});
  CHECK(kept(1, 1.0) == std::set<int64_t>{4});
  CHECK(kept(0, 0.6) == std::set<int64_t>{4, 0});      // 0.40 + 0.25 covers 0.6.
  CHECK(kept(0, 0.66) == std::set<int64_t>{4, 0, 5});  // 0.65 falls short of 0.66.
  CHECK(kept(0, 0.3) == std::set<int64_t>{4});         // The top token always stays.
  // top-p after top-k, on the renormalised top-k mass: 0.40/0.80 = 0.5 < 0.55 → two tokens.
  CHECK(kept(3, 0.55) == std::set<int64_t>{4, 0});
  CHECK(kept(0, 1.0).size() == 6);

  // Draws from a filtered distribution: only kept tokens, at their renormalised frequencies.
  const int64_t draws = 30000;
  const auto counts = Histogram(logits, 1.0, 3, 1.0, draws, /*seed=*/99);
  std::vector<double> expected(6, 0.0);
  for (int i = 0; i < 3; ++i) expected[where[i]] = ranked[i] / 0.80;
  for (int i = 3; i < 6; ++i) CHECK(counts[where[i]] == 0);
  CHECK(ChiSquare(counts, expected, draws) < 13.82);  // 2 degrees of freedom, 0.1%.
}

TEST_CASE("the same seed gives the same output, whatever shares the batch", "[rollout]") {
  auto engine = MakeEngine(Load("tiny-llama"));
  GenerationRequest request{Prompt(7, 3), {}};
  request.sampling.temperature = 1.0;
  request.sampling.seed = 42;
  request.sampling.max_new_tokens = 16;
  request.sampling.ignore_eos = true;
  const auto alone = MustGenerate(*engine, {request});
  const auto again =
      MustGenerate(*engine, {Greedy(Prompt(4, 9), 5), request, Greedy(Prompt(11, 1), 9)});
  CHECK(alone[0].samples[0].token_ids == again[1].samples[0].token_ids);
  // Log-probs agree to float rounding (the batch shape changes the GEMMs' summation order).
  CHECK(at::allclose(at::tensor(alone[0].samples[0].logprobs),
                     at::tensor(again[1].samples[0].logprobs), 1e-5, 1e-5));
  request.sampling.seed = 43;
  const auto other = MustGenerate(*engine, {request});
  CHECK(other[0].samples[0].token_ids != alone[0].samples[0].token_ids);
}

TEST_CASE("continuous batching gives each prompt's output alone", "[rollout]") {
  model::Transformer model = Load("tiny-mistral");
  std::vector<GenerationRequest> requests;
  for (int64_t i = 0; i < 7; ++i) {
    GenerationRequest request = Greedy(Prompt(3 + 2 * i, i), 4 + 3 * (i % 4));
    if (i % 2 == 1) {  // Sampled ones too: seeds make them comparable.
      request.sampling.temperature = 0.9;
      request.sampling.seed = 100 + i;
      request.sampling.ignore_eos = true;
    }
    requests.push_back(request);
  }
  auto alone_engine = MakeEngine(model);
  std::vector<Completion> alone;
  for (const auto& request : requests) {
    alone.push_back(MustGenerate(*alone_engine, {request})[0].samples[0]);
  }
  // Fewer rows than prompts: sequences join as others finish, at different steps. With a small
  // prefill budget one prompt joins at a time; with a large one a prefill fills every free row.
  const auto [rows, prefill_tokens] =
      GENERATE(std::pair<int64_t, int64_t>{2, 8}, std::pair<int64_t, int64_t>{3, 16384});
  INFO(rows << " rows, prefill budget " << prefill_tokens);
  EngineOptions options;
  options.max_num_seqs = rows;
  options.max_prefill_tokens = prefill_tokens;
  auto engine = MakeEngine(model, options);
  const auto together = MustGenerate(*engine, requests);
  CHECK(engine->stats().peak_running == rows);
  CHECK(engine->stats().prompts == 7);
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i);
    CHECK(together[i].samples[0].token_ids == alone[i].token_ids);
    CHECK(at::allclose(at::tensor(together[i].samples[0].logprobs), at::tensor(alone[i].logprobs),
                       1e-5, 1e-5));
  }
}

TEST_CASE("n samples share one prefill and equal n separate prompts", "[rollout]") {
  auto engine = MakeEngine(Load("tiny-qwen3"));
  GenerationRequest shared = Greedy(Prompt(10, 5), 8);
  shared.sampling.n = 3;
  const auto results = MustGenerate(*engine, {shared});
  CHECK(engine->stats().prompts == 1);  // One prefill for the three samples.
  const auto separate = MustGenerate(
      *engine, {Greedy(Prompt(10, 5), 8), Greedy(Prompt(10, 5), 8), Greedy(Prompt(10, 5), 8)});
  REQUIRE(results[0].samples.size() == 3);
  for (int j = 0; j < 3; ++j) {
    CHECK(results[0].samples[j].token_ids == separate[j].samples[0].token_ids);
  }
  // A prompt of 40 tokens fills one block of 32 and part of a second: the 4 samples hold the
  // full block together, each with its own copy of the second (5 blocks, not 8), and decode
  // what 4 separate prompts do.
  auto fresh = MakeEngine(Load("tiny-qwen3"));
  GenerationRequest long_prompt = Greedy(Prompt(40, 2), 8);
  long_prompt.sampling.n = 4;
  const auto grouped = MustGenerate(*fresh, {long_prompt});
  CHECK(fresh->stats().peak_blocks == 5);
  const auto apart =
      MustGenerate(*fresh, std::vector<GenerationRequest>(4, Greedy(Prompt(40, 2), 8)));
  CHECK(fresh->stats().peak_blocks == 8);
  for (int j = 0; j < 4; ++j) {
    CHECK(grouped[0].samples[j].token_ids == apart[j].samples[0].token_ids);
  }
  // Sampled: the n samples differ from each other, and each is reproducible.
  GenerationRequest sampled{Prompt(10, 5), {}};
  sampled.sampling.n = 4;
  sampled.sampling.seed = 7;
  sampled.sampling.max_new_tokens = 12;
  sampled.sampling.ignore_eos = true;
  const auto first = MustGenerate(*engine, {sampled});
  const auto second = MustGenerate(*engine, {sampled});
  std::set<std::vector<int64_t>> distinct;
  for (int j = 0; j < 4; ++j) {
    distinct.insert(first[0].samples[j].token_ids);
    CHECK(first[0].samples[j].token_ids == second[0].samples[j].token_ids);
  }
  CHECK(distinct.size() == 4);
}

TEST_CASE("the block pool hands out free blocks and takes a shared one back with its last holder",
          "[rollout]") {
  BlockPool pool(3, /*block_size=*/32, /*prefix_caching=*/true);
  CHECK(pool.free_blocks() == 3);
  const int64_t a = pool.Take(), b = pool.Take();
  CHECK(a != b);
  CHECK(pool.free_blocks() == 1);
  pool.Share(a);  // Two holders: a prompt's full block and its sibling sample.
  pool.Release(a);
  CHECK(pool.free_blocks() == 1);
  pool.Release(a);
  CHECK(pool.free_blocks() == 2);
  const int64_t c = pool.Take();
  CHECK(c == a);  // The freed block again, not a fresh id.
  pool.Release(b);
  pool.Release(c);
  CHECK(pool.free_blocks() == 3);
  CHECK_THROWS(pool.Release(b));  // Releasing a free block is a scheduler bug, caught.
  CHECK_THROWS(pool.Share(b));
}

TEST_CASE("the prefix cache finds a block by its tokens and its parent, and evicts the oldest",
          "[rollout]") {
  BlockPool pool(3, /*block_size=*/2, /*prefix_caching=*/true);
  const std::vector<int64_t> first = {1, 2}, second = {3, 4};
  const int64_t a = pool.Take(), b = pool.Take();
  const uint64_t key_a = pool.Register(a, 0, first);
  const uint64_t key_b = pool.Register(b, key_a, second);
  CHECK(key_a != 0);
  CHECK(key_b != 0);
  CHECK(key_b != key_a);
  // The same content in another block: that block stays unregistered, the key is the first's.
  const int64_t c = pool.Take();
  CHECK(pool.Register(c, 0, first) == key_a);
  pool.Release(c);
  CHECK(pool.free_blocks() == 1);
  // Held: found and shared. Released by all: cached, still found, and counted as free.
  const auto held = pool.Acquire(0, first);
  REQUIRE(held.has_value());
  CHECK(*held == std::make_pair(a, key_a));
  pool.Release(a);
  pool.Release(a);
  pool.Release(b);
  CHECK(pool.free_blocks() == 3);
  CHECK_FALSE(pool.Acquire(key_b, first).has_value());  // Another parent: other content.
  const auto again = pool.Acquire(key_a, second);
  REQUIRE(again.has_value());
  CHECK(again->first == b);
  CHECK(pool.free_blocks() == 2);
  pool.Release(b);
  // Taking evicts: the free block first, then the cached block released longest ago (a).
  CHECK(pool.Take() == c);
  CHECK(pool.Take() == a);
  CHECK_FALSE(pool.Acquire(0, first).has_value());
  CHECK(pool.Acquire(key_a, second).has_value());  // b stays; its parent's key is never reused.
  pool.Release(b);
  // Content whose only copy nobody holds moves to a block that registers it again: the key
  // stays, the old block is free (so the content stays cached while anyone holds it).
  pool.Release(c);
  CHECK(pool.Register(a, 0, second) != key_b);  // Other content (another parent): a new key.
  const int64_t d = pool.Take();
  CHECK(d == c);
  CHECK(pool.Register(d, key_a, second) == key_b);
  CHECK(pool.free_blocks() == 1);  // b went back to the free list, d holds the registration.
  CHECK(pool.Take() == b);
  pool.Release(d);
  CHECK(pool.Acquire(key_a, second) == std::make_pair(d, key_b));
  // Prefix caching off: nothing is registered or found.
  BlockPool plain(1, /*block_size=*/2, /*prefix_caching=*/false);
  const int64_t only = plain.Take();
  CHECK(plain.Register(only, 0, first) == 0);
  plain.Release(only);
  CHECK_FALSE(plain.Acquire(0, first).has_value());
  CHECK(plain.free_blocks() == 1);
}

TEST_CASE("a sequence's blocks: a cached prefix taken, siblings sharing, released last first",
          "[rollout]") {
  BlockPool pool(8, /*block_size=*/2, /*prefix_caching=*/true);
  const std::vector<int64_t> context = {1, 2, 3, 4, 5};  // Two whole blocks and a partial one.
  std::vector<int64_t> first;
  CHECK(pool.TakeContext(context, first) == 0);  // Nothing cached yet.
  CHECK(first.size() == 3);
  // A sibling shares the two whole blocks and copies the partial one.
  std::vector<int64_t> sibling;
  const auto copy = pool.ShareContext(first, 5, sibling);
  REQUIRE(copy.has_value());
  CHECK(copy->first == first[2]);
  CHECK(sibling == std::vector<int64_t>{first[0], first[1], copy->second});
  CHECK(pool.held_blocks() == 4);
  // Released with 4 positions written: the two whole blocks are cached, last first.
  pool.ReleaseContext(context, sibling, 4);
  pool.ReleaseContext(context, first, 4);
  CHECK(first.empty());
  CHECK(pool.held_blocks() == 0);
  // The same context again finds both whole blocks (short of the last token's block).
  std::vector<int64_t> again;
  CHECK(pool.TakeContext(context, again) == 4);
  // A context of exactly two blocks finds only the first: its last token must be computed.
  std::vector<int64_t> edge;
  CHECK(pool.TakeContext(std::vector<int64_t>{1, 2, 3, 4}, edge) == 2);
}

// The paged cache holds what sequences actually use: a cache of 10 blocks of 32 positions (320,
// less than two sequences of max_model_len 256 would need as whole slots) decodes eight short
// sequences together, without preempting any.
TEST_CASE("the paged KV cache's memory follows the sequences' lengths, not max_model_len",
          "[rollout][paged]") {
  EngineOptions options;
  options.max_model_len = 256;
  options.cache_blocks_override = 10;
  auto engine = MakeEngine(Load("tiny-qwen2"), options);
  std::vector<GenerationRequest> requests;
  for (int64_t i = 0; i < 8; ++i) {
    GenerationRequest request = Greedy(Prompt(6 + i, i), 16);
    request.sampling.ignore_eos = true;
    requests.push_back(request);
  }
  const auto results = MustGenerate(*engine, requests);
  CHECK(engine->stats().cache_blocks == 10);
  CHECK(engine->stats().peak_running == 8);
  CHECK(engine->stats().preemptions == 0);
  for (const GenerationResult& result : results) CHECK(result.samples[0].token_ids.size() == 16);
}

// A cache too small for every sequence at once: sequences that cross into a new block when none
// is free preempt the ones admitted last, which are prefilled again later from their tokens so
// far. Greedy and seeded sampled rows, a request of n = 3 (its samples sharing the prompt's full
// blocks), prompts ending inside a block and on its edge (32): every sample's tokens equal those
// of a cache with room for all, and its log-probs within 1e-4 (a preempted sample's context is
// prefilled where it was decoded). Independent of any cache, both are checked against the model's
// own forward over prompt + response: each token's log-probability under softmax(logits / T)
// within 1e-4, and a greedy row's tokens its argmax.
TEST_CASE("a KV cache exhausted mid-run preempts and resumes sequences without changing results",
          "[rollout][paged]") {
  for (const std::string name : {"tiny-qwen3", "tiny-llama"}) {
    INFO(name);
    model::Transformer model = Load(name);
    std::vector<GenerationRequest> requests;
    for (int64_t i = 0; i < 6; ++i) {
      GenerationRequest request = Greedy(Prompt(i == 2 ? 32 : 5 + 4 * i, i), 40 + 7 * (i % 3));
      request.sampling.ignore_eos = true;
      if (i % 2 == 1) {
        request.sampling.temperature = 0.8;
        request.sampling.seed = 40 + i;
      }
      if (i == 3) request.sampling.n = 3;
      requests.push_back(request);
    }
    EngineOptions options;
    options.max_model_len = 96;  // 3 blocks of 32.
    auto roomy = MakeEngine(model, options);
    const auto expected = MustGenerate(*roomy, requests);
    CHECK(roomy->stats().preemptions == 0);
    options.cache_blocks_override = 5;
    auto tight = MakeEngine(model, options);
    const auto results = MustGenerate(*tight, requests);
    CHECK(tight->stats().preemptions > 0);
    CHECK(tight->stats().cached_prefix_tokens > 0);  // Some came back to their cached blocks.
    for (size_t i = 0; i < requests.size(); ++i) {
      REQUIRE(results[i].samples.size() == expected[i].samples.size());
      for (size_t j = 0; j < results[i].samples.size(); ++j) {
        INFO("request " << i << " sample " << j);
        const Completion& got = results[i].samples[j];
        const Completion& want = expected[i].samples[j];
        CHECK(got.token_ids == want.token_ids);
        CHECK(got.finish_reason == want.finish_reason);
        REQUIRE(got.logprobs.size() == want.logprobs.size());
        CHECK(at::allclose(at::tensor(got.logprobs), at::tensor(want.logprobs), 1e-4, 1e-4));
      }
    }
    CheckAgainstUncachedForward(model, requests, results);
    std::cout << "rollout_test: " << name << " with 5 blocks: " << tight->stats().preemptions
              << " preemptions\n";
  }
}

// Prompts sharing a 70-token prefix (two whole blocks) among two that do not, one of them
// with n = 2. Prefilled one at a time, each sharing prompt after the first finds those blocks in
// the prefix cache and prefills only its own tokens; two at a time, the first two compute the
// prefix together (blocks are registered after their prefill), and later prefills mix rows with
// and without a cached prefix. Greedy and seeded sampled rows give the tokens of an engine
// without the cache, and log-probs equal to the model's own forward over prompt + response
// (1e-4).
TEST_CASE("prompts sharing a prefix prefill it once, with the results of an engine without it",
          "[rollout][paged]") {
  model::Transformer model = Load("tiny-qwen2");
  const std::vector<int64_t> shared = Prompt(70, 9);
  std::vector<GenerationRequest> requests;
  for (int64_t i = 0; i < 6; ++i) {
    const bool sharing = i != 2 && i != 5;
    std::vector<int64_t> prompt = sharing ? shared : Prompt(70, 40 + i);
    const std::vector<int64_t> own = Prompt(3 + i, 20 + i);
    prompt.insert(prompt.end(), own.begin(), own.end());
    GenerationRequest request = Greedy(prompt, 12);
    request.sampling.ignore_eos = true;
    if (i % 2 == 1) {
      request.sampling.temperature = 0.7;
      request.sampling.seed = 70 + i;
    }
    if (i == 3) request.sampling.n = 2;
    requests.push_back(request);
  }
  // One prompt per prefill: prompts 1, 3 and 4 find the prefix; two per prefill (0 and 1, 2 and
  // 3, 4 and 5): prompts 3 and 4.
  const auto [prefill_budget, found] =
      GENERATE(std::pair<int64_t, int64_t>{80, 3 * 64}, std::pair<int64_t, int64_t>{160, 2 * 64});
  INFO("prefill budget " << prefill_budget);
  EngineOptions options;
  options.max_model_len = 128;
  options.max_prefill_tokens = prefill_budget;
  options.enable_prefix_caching = false;
  auto plain = MakeEngine(model, options);
  const auto expected = MustGenerate(*plain, requests);
  CHECK(plain->stats().cached_prefix_tokens == 0);
  options.enable_prefix_caching = true;
  auto caching = MakeEngine(model, options);
  const auto results = MustGenerate(*caching, requests);
  CHECK(caching->stats().cached_prefix_tokens == found);
  CHECK(caching->stats().prefill_tokens == plain->stats().prefill_tokens - found);
  CheckAgainstUncachedForward(model, requests, results);
  for (size_t i = 0; i < requests.size(); ++i) {
    REQUIRE(results[i].samples.size() == expected[i].samples.size());
    for (size_t j = 0; j < results[i].samples.size(); ++j) {
      INFO("request " << i << " sample " << j);
      const Completion& got = results[i].samples[j];
      CHECK(got.token_ids == expected[i].samples[j].token_ids);
    }
  }
}

TEST_CASE("a request whose samples' prompt blocks cannot fit the cache is refused up front",
          "[rollout][paged]") {
  EngineOptions options;
  options.max_model_len = 64;
  options.cache_blocks_override = 2;  // One sequence of max_model_len.
  auto engine = MakeEngine(Load("tiny-qwen2"), options);
  GenerationRequest request = Greedy(Prompt(40, 1), 4);
  request.sampling.n = 3;  // Two blocks, and a copy of the partly filled one for each sibling.
  auto result = engine->Generate({request});
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(std::string(result.status().message()), Catch::Contains("request 0") &&
                                                         Catch::Contains("4 KV cache blocks") &&
                                                         Catch::Contains("the cache has 2"));
  CHECK(MustGenerate(*engine, {Greedy(Prompt(40, 1), 4)})[0].samples[0].token_ids.size() == 4);
  options.kv_block_size = 48;
  CHECK_THAT(std::string(GenerationEngine::Create(Load("tiny-qwen2"), options).status().message()),
             Catch::Contains("kv_block_size must be a positive multiple of 32"));
}

// A scripted turn handler: after each of a sample's first `continuations` stops it inserts
// {50 + turn, 8, 9} (or `inserted` when given), answering on a thread of its own after a short
// wait, so that the other samples decode meanwhile; later stops finish the sample.
class ScriptedTurns : public TurnHandler {
 public:
  explicit ScriptedTurns(int continuations, std::vector<int64_t> inserted = {})
      : continuations_(continuations), inserted_(std::move(inserted)) {}
  std::future<TurnOutcome> OnStop(size_t request, int64_t sample,
                                  const Completion& completion) override {
    const int turn = turns_[{request, sample}]++;
    stops_ += 1;
    std::vector<int64_t> tokens = inserted_.empty() ? Insertion(turn) : inserted_;
    const bool finish = turn >= continuations_;
    CHECK(completion.token_ids.size() == completion.response_mask.size());
    return std::async(std::launch::async, [finish, tokens] {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      return TurnOutcome{finish, finish ? std::vector<int64_t>{} : tokens};
    });
  }
  static std::vector<int64_t> Insertion(int turn) { return {50 + turn, 8, 9}; }
  int stops() const { return stops_; }

 private:
  int continuations_;
  std::vector<int64_t> inserted_;
  std::map<std::pair<size_t, int64_t>, int> turns_;
  int stops_ = 0;
};

// The same conversation turn by turn: each turn a separate greedy request over the prompt and
// everything so far, the insertion appended after each stop.
Completion TurnByTurn(GenerationEngine& engine, const GenerationRequest& request,
                      int continuations) {
  Completion out;
  const int64_t budget = request.sampling.max_new_tokens;
  for (int turn = 0;; ++turn) {
    GenerationRequest next = request;
    next.prompt_ids.insert(next.prompt_ids.end(), out.token_ids.begin(), out.token_ids.end());
    next.sampling.max_new_tokens = budget - static_cast<int64_t>(out.token_ids.size());
    const Completion part = MustGenerate(engine, {next})[0].samples[0];
    out.token_ids.insert(out.token_ids.end(), part.token_ids.begin(), part.token_ids.end());
    out.logprobs.insert(out.logprobs.end(), part.logprobs.begin(), part.logprobs.end());
    out.response_mask.insert(out.response_mask.end(), part.token_ids.size(), 1);
    out.finish_reason = part.finish_reason;
    if (part.finish_reason != FinishReason::kStop || turn >= continuations) return out;
    const std::vector<int64_t> inserted = ScriptedTurns::Insertion(turn);
    const int64_t room = budget - static_cast<int64_t>(out.token_ids.size());
    const int64_t taken = std::min<int64_t>(room, inserted.size());
    out.token_ids.insert(out.token_ids.end(), inserted.begin(), inserted.begin() + taken);
    out.logprobs.insert(out.logprobs.end(), taken, 0.f);
    out.response_mask.insert(out.response_mask.end(), taken, 0);
    if (taken == room) {
      out.finish_reason = FinishReason::kLength;
      return out;
    }
  }
}

TEST_CASE("multi-turn: a sample that goes on after its stops equals its turns one by one",
          "[rollout][multi_turn]") {
  model::Transformer model = Load("tiny-qwen2");
  EngineOptions options;
  options.max_model_len = 128;
  auto engine = MakeEngine(model, options);
  // Each prompt stops at the third token its plain greedy response has, so that it stops early
  // and again after each insertion whenever greedy decoding meets that token. Prompts of 24-36
  // tokens: contexts pass a block's 32 positions, which the prefix cache keeps between turns.
  std::vector<GenerationRequest> requests;
  for (int64_t i = 0; i < 5; ++i) {
    GenerationRequest request = Greedy(Prompt(24 + 3 * i, i), 12);
    const Completion plain = MustGenerate(*engine, {request})[0].samples[0];
    REQUIRE(plain.token_ids.size() >= 3);
    request.sampling.stop_token_ids = {plain.token_ids[2]};
    request.sampling.max_new_tokens = 14 + 4 * i;
    requests.push_back(request);
  }
  const int continuations = 2;
  std::vector<Completion> expected;
  for (const GenerationRequest& request : requests) {
    expected.push_back(TurnByTurn(*engine, request, continuations));
  }
  // Two rows for five prompts: samples pause, resume and join at different steps.
  options.max_num_seqs = 2;
  auto together = MakeEngine(model, options);
  ScriptedTurns turns(continuations);
  auto results = together->Generate(requests, &turns);
  REQUIRE(results.ok());
  int inserted = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i);
    const Completion& got = (*results)[i].samples[0];
    CHECK(got.token_ids == expected[i].token_ids);
    CHECK(got.response_mask == expected[i].response_mask);
    CHECK(got.finish_reason == expected[i].finish_reason);
    REQUIRE(got.logprobs.size() == got.token_ids.size());
    CHECK(at::allclose(at::tensor(got.logprobs), at::tensor(expected[i].logprobs), 1e-5, 1e-5));
    inserted += static_cast<int>(std::count(got.response_mask.begin(), got.response_mask.end(), 0));
  }
  CHECK(inserted >= 3 * 5);  // every prompt went on at least once
  CHECK(together->stats().resumed_turns >= 5);
  // A sample going on found its earlier turns' whole blocks in the prefix cache.
  CHECK(together->stats().cached_prefix_tokens > 0);
  CHECK(turns.stops() >= 5);
}

TEST_CASE("multi-turn: sampled log-probs are those of one forward over the whole trajectory",
          "[rollout][multi_turn]") {
  // Independent of the engine's cache: the model's own forward over prompt + response, without
  // a cache, gives each sampled token's log-probability at temperature 1.
  model::Transformer model = Load("tiny-llama");
  auto engine = MakeEngine(model);
  GenerationRequest request{Prompt(9, 3), {}};
  request.sampling.temperature = 1.0;
  request.sampling.seed = 11;
  request.sampling.max_new_tokens = 40;
  request.sampling.n = 3;
  // Stop on a token the samples are likely to meet: the first of a plain draw.
  const Completion plain = MustGenerate(*engine, {request})[0].samples[0];
  request.sampling.stop_token_ids = {plain.token_ids[0], plain.token_ids[1]};
  ScriptedTurns turns(3, {5, 6, 7, 8});
  auto results = engine->Generate({request}, &turns);
  REQUIRE(results.ok());
  int went_on = 0;
  for (const Completion& sample : (*results)[0].samples) {
    std::vector<int64_t> ids = request.prompt_ids;
    ids.insert(ids.end(), sample.token_ids.begin(), sample.token_ids.end());
    const at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
    at::Tensor log_probs;
    {
      c10::InferenceMode inference;
      log_probs =
          at::log_softmax(model->Logits(model->Hidden(model::ForwardBatch{input, at::Tensor()}))
                              .squeeze(0)
                              .to(at::kDouble),
                          -1);
    }
    const int64_t p = static_cast<int64_t>(request.prompt_ids.size());
    for (size_t t = 0; t < sample.token_ids.size(); ++t) {
      INFO("token " << t);
      if (sample.response_mask[t] == 0) {
        CHECK(sample.logprobs[t] == 0.f);
        continue;
      }
      const double reference =
          log_probs[p + static_cast<int64_t>(t) - 1][sample.token_ids[t]].item<double>();
      CHECK(sample.logprobs[t] == Approx(reference).margin(1e-4));
    }
    went_on += std::count(sample.response_mask.begin(), sample.response_mask.end(), 0) > 0;
  }
  CHECK(went_on >= 1);
}

// A handler whose future throws ends its sample as it stands; an insertion longer than the
// budget is cut at max_new_tokens (finish "length"); the engine carries on.
class FailingTurns : public TurnHandler {
 public:
  std::future<TurnOutcome> OnStop(size_t request, int64_t, const Completion&) override {
    if (request == 0) {
      return std::async(std::launch::async,
                        []() -> TurnOutcome { throw std::runtime_error("tool crashed"); });
    }
    std::promise<TurnOutcome> outcome;
    outcome.set_value({false, std::vector<int64_t>(100, 7)});
    return outcome.get_future();
  }
};

TEST_CASE("multi-turn: a failing handler ends its sample; an oversized insertion is cut",
          "[rollout][multi_turn]") {
  auto engine = MakeEngine(Load("tiny-qwen2"));
  std::vector<GenerationRequest> requests;
  for (int64_t i = 0; i < 2; ++i) {
    GenerationRequest request = Greedy(Prompt(6, 7 + i), 10);
    const Completion plain = MustGenerate(*engine, {request})[0].samples[0];
    request.sampling.stop_token_ids = {plain.token_ids[1]};
    request.sampling.max_new_tokens = 20;
    requests.push_back(request);
  }
  FailingTurns turns;
  auto results = engine->Generate(requests, &turns);
  REQUIRE(results.ok());
  const Completion& failed = (*results)[0].samples[0];
  CHECK(failed.finish_reason == FinishReason::kStop);
  CHECK(std::count(failed.response_mask.begin(), failed.response_mask.end(), 0) == 0);
  const Completion& cut = (*results)[1].samples[0];
  CHECK(cut.token_ids.size() == 20);
  CHECK(cut.finish_reason == FinishReason::kLength);
  CHECK(cut.response_mask.back() == 0);
  // And the engine serves the next call.
  CHECK(MustGenerate(*engine, {Greedy(Prompt(5, 1), 4)})[0].samples[0].token_ids.size() == 4);
}

TEST_CASE("stop tokens, EOS and max_new_tokens end a response", "[rollout]") {
  model::Transformer model = Load("tiny-llama");
  auto engine = MakeEngine(model);
  const Completion free_run = MustGenerate(*engine, {Greedy(Prompt(5, 4), 10)})[0].samples[0];
  REQUIRE(free_run.token_ids.size() == 10);
  CHECK(free_run.finish_reason == FinishReason::kLength);
  // The 4th token as a stop token: the response ends with it (or earlier, if it came before).
  GenerationRequest stopped = Greedy(Prompt(5, 4), 10);
  stopped.sampling.stop_token_ids = {free_run.token_ids[3]};
  const Completion stop = MustGenerate(*engine, {stopped})[0].samples[0];
  CHECK(stop.finish_reason == FinishReason::kStop);
  CHECK(stop.token_ids.back() == free_run.token_ids[3]);
  CHECK(stop.token_ids.size() <= 4);
  // The same token as EOS through the options, and ignore_eos running on past it.
  EngineOptions options;
  options.eos_token_ids = {free_run.token_ids[3]};
  auto eos_engine = MakeEngine(model, options);
  CHECK(MustGenerate(*eos_engine, {Greedy(Prompt(5, 4), 10)})[0].samples[0].token_ids ==
        stop.token_ids);
  GenerationRequest ignoring = Greedy(Prompt(5, 4), 10);
  ignoring.sampling.ignore_eos = true;
  CHECK(MustGenerate(*eos_engine, {ignoring})[0].samples[0].token_ids == free_run.token_ids);
}

TEST_CASE("bad requests are refused with the field to fix; the engine carries on", "[rollout]") {
  auto engine = MakeEngine(Load("tiny-qwen2"));
  const auto refused = [&](GenerationRequest bad, const std::string& says) {
    auto result = engine->Generate({Greedy(Prompt(3, 0), 2), bad});
    REQUIRE_FALSE(result.ok());
    INFO(result.status().ToString());
    CHECK_THAT(std::string(result.status().message()), Catch::Contains("request 1"));
    CHECK_THAT(std::string(result.status().message()), Catch::Contains(says));
  };
  refused(Greedy({}, 4), "empty prompt");
  refused(Greedy({1, 2, 512}, 4), "outside the vocabulary");
  refused(Greedy(Prompt(60, 0), 10), "exceeds max_model_len 64");
  GenerationRequest bad = Greedy(Prompt(3, 0), 4);
  bad.sampling.top_p = 0;
  refused(bad, "top_p");
  bad = Greedy(Prompt(3, 0), 4);
  bad.sampling.n = 0;
  refused(bad, "n must be");
  bad = Greedy(Prompt(3, 0), 4);
  bad.sampling.temperature = -1;
  refused(bad, "temperature");
  bad = Greedy(Prompt(3, 0), 0);
  refused(bad, "max_new_tokens");
  CHECK(MustGenerate(*engine, {Greedy(Prompt(3, 0), 2)})[0].samples[0].token_ids.size() == 2);

  EngineOptions options;
  options.max_model_len = 64;
  options.cpu_cache_bytes = 1024;  // Not one sequence's blocks.
  auto small = GenerationEngine::Create(Load("tiny-qwen2"), options);
  REQUIRE(small.ok());
  auto result = (*small)->Generate({Greedy(Prompt(3, 0), 2)});
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(std::string(result.status().message()), Catch::Contains("cpu_cache_bytes"));
}

TEST_CASE("release frees the cache and the next generate rebuilds it", "[rollout]") {
  auto engine = MakeEngine(Load("tiny-llama3-rope"));
  const auto before = MustGenerate(*engine, {Greedy(Prompt(6, 2), 6)});
  CHECK(engine->holds_memory());
  engine->Release();
  CHECK_FALSE(engine->holds_memory());
  const auto after = MustGenerate(*engine, {Greedy(Prompt(6, 2), 6)});
  CHECK(before[0].samples[0].token_ids == after[0].samples[0].token_ids);
}

// Partial rollouts (trainer.mode async): a call interrupted mid-way returns every unfinished
// sample with its tokens so far; resumed from them (each its own request, with its own seed),
// the samples end as they would have uninterrupted: the same tokens, sampled or greedy, and the
// same log-probs (the resumed context is prefilled where it was decoded: within 1e-4). Two rows
// for six samples, so some wait unadmitted when the interruption comes.
TEST_CASE("partial rollouts: interrupted samples resumed from their tokens end as uninterrupted",
          "[rollout][partial]") {
  EngineOptions options;
  options.max_num_seqs = 2;
  options.decode_step_hold = std::chrono::milliseconds(2);
  auto engine = MakeEngine(Load("tiny-qwen3"), options);
  std::vector<GenerationRequest> requests;
  for (int64_t i = 0; i < 3; ++i) {
    GenerationRequest request{Prompt(6 + i, i), {}};
    request.sampling.n = 2;
    request.sampling.seed = 11 + i;
    request.sampling.temperature = i == 2 ? 0 : 0.9;
    request.sampling.max_new_tokens = 20;
    request.sampling.ignore_eos = true;
    requests.push_back(request);
  }
  const std::vector<GenerationResult> whole = MustGenerate(*engine, requests);

  // Each round interrupts a little later; the unfinished samples go on in the next.
  std::vector<std::vector<Completion>> so_far(3, std::vector<Completion>(2));
  for (auto& samples : so_far) {
    for (Completion& sample : samples) sample.finish_reason = FinishReason::kInterrupted;
  }
  int partial_rounds = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<GenerationRequest> going_on;
    std::vector<std::pair<int64_t, int64_t>> which;
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        if (so_far[i][j].finish_reason != FinishReason::kInterrupted) continue;
        GenerationRequest resumed = requests[i];
        resumed.sampling.n = 1;
        resumed.sampling.seed = SampleSeed(*requests[i].sampling.seed, j);
        resumed.resumed = so_far[i][j];
        going_on.push_back(std::move(resumed));
        which.emplace_back(i, j);
      }
    }
    if (going_on.empty()) break;
    std::atomic<int64_t> interrupt{0};
    std::thread interrupter([&interrupt, round] {
      std::this_thread::sleep_for(std::chrono::milliseconds(6 + 4 * round));
      interrupt = 1;
    });
    auto results = engine->Generate(going_on, nullptr, &interrupt);
    interrupter.join();
    INFO(results.status());
    REQUIRE(results.ok());
    for (size_t k = 0; k < which.size(); ++k) {
      const auto [i, j] = which[k];
      const Completion& sample = (*results)[k].samples[0];
      const size_t before = so_far[i][j].token_ids.size();
      REQUIRE(sample.token_ids.size() >= before);
      CHECK(std::equal(so_far[i][j].token_ids.begin(), so_far[i][j].token_ids.end(),
                       sample.token_ids.begin()));
      if (sample.finish_reason == FinishReason::kInterrupted && sample.token_ids.size() > before &&
          sample.token_ids.size() < 20) {
        ++partial_rounds;
      }
      so_far[i][j] = sample;
    }
  }
  CHECK(partial_rounds > 0);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      INFO("prompt " << i << " sample " << j);
      const Completion& resumed = so_far[i][j];
      const Completion& expected = whole[i].samples[j];
      REQUIRE(resumed.finish_reason == FinishReason::kLength);
      CHECK(resumed.token_ids == expected.token_ids);
      REQUIRE(resumed.logprobs.size() == expected.logprobs.size());
      for (size_t t = 0; t < expected.logprobs.size(); ++t) {
        CHECK(std::abs(resumed.logprobs[t] - expected.logprobs[t]) < 1e-4);
      }
    }
  }
  // A resumed request is checked: n 1, its own seed, fewer tokens than max_new_tokens.
  GenerationRequest bad = requests[0];
  bad.resumed = whole[0].samples[0];
  const auto refused = engine->Generate({bad});
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("resumed sample"));
}

}  // namespace rlhfd::rollout

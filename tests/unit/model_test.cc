// The transformer against Hugging Face transformers: logits of every architecture fixture in
// fp32 on CPU within 1e-4, score heads, packed sequences, KV-cached decoding, and strict loading;
// a frozen bf16 model under autocast computes as its float32 master.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/types.h>

#include <catch2/catch.hpp>

#include "common/util/files.h"
#include "tests/support/subprocess.h"
#include "worker/model/model_export.h"
#include "worker/model/model_loader.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/state_dict.h"

namespace rlhfd::model {
namespace {

const std::string kModels = std::string(RLHFD_FIXTURES_DIR) + "/models/";

struct Golden {
  at::Tensor input_ids, attention_mask, logits, token_scores;
};

Golden LoadGolden(const std::string& name) {
  auto dict = StateDict::Load(kModels + name + "/golden.safetensors");
  REQUIRE(dict.ok());
  Golden golden;
  golden.input_ids = dict->Get("input_ids")->clone();
  golden.attention_mask = dict->Get("attention_mask")->clone();
  golden.logits = dict->Get("logits")->clone();
  if (dict->contains("token_scores")) golden.token_scores = dict->Get("token_scores")->clone();
  return golden;
}

Transformer Load(const std::string& name) {
  auto model = LoadModel(kModels + name, {});
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  return *model;
}

// Largest |a - b| over the positions the mask marks as tokens. a, b: (B, T, X).
double MaxDiffOnTokens(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  at::Tensor keep = mask.to(at::kBool).unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(keep).max().item<double>();
}

}  // namespace

TEST_CASE("causal-LM logits match transformers in fp32 (max |diff| <= 1e-4)", "[model]") {
  torch::NoGradGuard no_grad;
  for (const std::string name :
       {"tiny-llama", "tiny-llama3-rope", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"}) {
    INFO(name);
    Transformer model = Load(name);
    Golden golden = LoadGolden(name);
    at::Tensor hidden = model->Hidden({golden.input_ids, golden.attention_mask});
    at::Tensor logits = model->Logits(hidden);
    REQUIRE(logits.sizes() == golden.logits.sizes());
    const double diff = MaxDiffOnTokens(logits, golden.logits, golden.attention_mask);
    INFO("max |diff| = " << diff << ", logit scale " << golden.logits.abs().max().item<double>());
    CHECK(diff <= 1e-4);
  }
}

TEST_CASE("score heads match transformers' classification outputs", "[model]") {
  torch::NoGradGuard no_grad;
  SECTION("sequence classification: pooled last token and per-token values") {
    Transformer model = Load("tiny-qwen2-rm");
    Golden golden = LoadGolden("tiny-qwen2-rm");
    at::Tensor scores = model->Scores(model->Hidden({golden.input_ids, golden.attention_mask}));
    CHECK(MaxDiffOnTokens(scores, golden.token_scores, golden.attention_mask) <= 1e-4);
    at::Tensor last = golden.attention_mask.sum(1) - 1;                    // Right padding.
    at::Tensor pooled = scores.index({at::arange(scores.size(0)), last});  // (B, L)
    CHECK((pooled - golden.logits).abs().max().item<double>() <= 1e-4);
  }
  SECTION("token classification") {
    Transformer model = Load("tiny-llama-value");
    Golden golden = LoadGolden("tiny-llama-value");
    at::Tensor scores = model->Scores(model->Hidden({golden.input_ids, golden.attention_mask}));
    CHECK(MaxDiffOnTokens(scores, golden.logits, golden.attention_mask) <= 1e-4);
  }
}

TEST_CASE("bf16 on the CPU is within 1e-2 relative error of fp32; norm weights stay fp32",
          "[model]") {
  // The [gpu] model test checks the same bound for bf16 on the GPU; this one runs everywhere.
  torch::NoGradGuard no_grad;
  for (const std::string name : {"tiny-llama", "tiny-llama3-rope", "tiny-qwen2", "tiny-qwen3",
                                 "tiny-mistral", "tiny-qwen2-rm", "tiny-llama-value"}) {
    INFO(name);
    Golden golden = LoadGolden(name);
    Transformer wide = Load(name);
    auto narrow = LoadModel(kModels + name, {at::kBFloat16, at::kCPU});
    REQUIRE(narrow.ok());
    auto parameters = (*narrow)->named_parameters();
    CHECK(parameters["model.layers.0.self_attn.q_proj.weight"].scalar_type() == at::kBFloat16);
    CHECK(parameters["model.norm.weight"].scalar_type() == at::kFloat);
    const ForwardBatch batch{golden.input_ids, golden.attention_mask};
    const bool lm = wide->config().head == HeadKind::kCausalLm;
    const at::Tensor reference =
        lm ? wide->Logits(wide->Hidden(batch)) : wide->Scores(wide->Hidden(batch));
    const at::Tensor hidden = (*narrow)->Hidden(batch);
    const at::Tensor out =
        (lm ? (*narrow)->Logits(hidden) : (*narrow)->Scores(hidden)).to(at::kFloat);
    const at::Tensor keep = golden.attention_mask.to(at::kBool).unsqueeze(-1).expand_as(reference);
    const double relative =
        ((out - reference).masked_select(keep).norm() / reference.masked_select(keep).norm())
            .item<double>();
    INFO("relative error " << relative);
    CHECK(relative <= 1e-2);
  }
}

TEST_CASE("under autocast a frozen bf16 model computes exactly as its float32 master does",
          "[model]") {
  // A role's GPU compute scope runs autocast: the actor's float32 masters are cast to bf16 for
  // each GEMM, the reference's weights are bf16 already. With the same (bf16-representable)
  // weights both forwards must be one computation, so that the actor's and the reference's
  // log-probs start equal and their KL measures the policy's drift alone. On the CPU, whose
  // autocast works as the GPU's; every layer kind of the fixtures.
  torch::NoGradGuard no_grad;
  for (const std::string name : {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen2-rm"}) {
    INFO(name);
    Golden golden = LoadGolden(name);
    auto narrow = LoadModel(kModels + name, {at::kBFloat16, at::kCPU});
    REQUIRE(narrow.ok());
    Transformer master = Load(name);
    auto frozen = (*narrow)->named_parameters();
    for (auto& item : master->named_parameters()) item.value().copy_(frozen[item.key()]);
    const ForwardBatch batch{golden.input_ids, golden.attention_mask};
    const bool lm = master->config().head == HeadKind::kCausalLm;
    const auto forward = [&](Transformer& model) {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      const at::Tensor hidden = model->Hidden(batch);
      at::Tensor out = lm ? model->Logits(hidden) : model->Scores(hidden);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
      return out;
    };
    const at::Tensor expected = forward(master), got = forward(*narrow);
    CHECK(got.scalar_type() == expected.scalar_type());
    CHECK(at::equal(got, expected));
  }
}

TEST_CASE("packed sequences give the same logits as the padded batch", "[model]") {
  torch::NoGradGuard no_grad;
  Transformer model = Load("tiny-qwen3");
  Golden golden = LoadGolden("tiny-qwen3");
  std::vector<at::Tensor> pieces, expected;
  std::vector<int64_t> starts = {0};
  for (int64_t b = 0; b < golden.input_ids.size(0); ++b) {
    const int64_t n = golden.attention_mask[b].sum().item<int64_t>();
    pieces.push_back(golden.input_ids[b].narrow(0, 0, n));
    expected.push_back(golden.logits[b].narrow(0, 0, n));
    starts.push_back(starts.back() + n);
  }
  ForwardBatch packed;
  packed.input_ids = at::cat(pieces).unsqueeze(0);  // (1, N)
  packed.cu_seqlens = at::tensor(starts, at::kLong);
  at::Tensor logits = model->Logits(model->Hidden(packed)).squeeze(0);  // (N, V)
  CHECK((logits - at::cat(expected)).abs().max().item<double>() <= 1e-4);
}

TEST_CASE("left padding and KV-cached decoding match the full forward", "[model]") {
  torch::NoGradGuard no_grad;
  Transformer model = Load("tiny-llama3-rope");
  Golden golden = LoadGolden("tiny-llama3-rope");
  // Sequence 1 (7 tokens) left-padded to 11.
  const int64_t n = 7, t = 11;
  at::Tensor ids = at::zeros({1, t}, at::kLong);
  ids.narrow(1, t - n, n).copy_(golden.input_ids[1].narrow(0, 0, n));
  at::Tensor mask = at::zeros({1, t}, at::kLong);
  mask.narrow(1, t - n, n).fill_(1);
  at::Tensor left = model->Logits(model->Hidden({ids, mask})).squeeze(0).narrow(0, t - n, n);
  CHECK((left - golden.logits[1].narrow(0, 0, n)).abs().max().item<double>() <= 1e-4);

  // Prefill 4 tokens, then decode the rest one at a time through the cache.
  KvCache cache(model->config(), /*batch=*/1, /*capacity=*/16,
                at::TensorOptions().dtype(at::kFloat));
  at::Tensor sequence = golden.input_ids[1].narrow(0, 0, n).unsqueeze(0);
  std::vector<at::Tensor> steps = {
      model->Logits(model->Hidden({sequence.narrow(1, 0, 4)}, &cache))};
  for (int64_t i = 4; i < n; ++i) {
    steps.push_back(model->Logits(model->Hidden({sequence.narrow(1, i, 1)}, &cache)));
  }
  CHECK(cache.length() == n);
  at::Tensor cached = at::cat(steps, 1).squeeze(0);
  CHECK((cached - golden.logits[1].narrow(0, 0, n)).abs().max().item<double>() <= 1e-4);
}

TEST_CASE("loading is strict and names the tensors that do not fit", "[model]") {
  auto config = LoadModelConfig(kModels + "tiny-llama");
  REQUIRE(config.ok());
  auto weights = StateDict::Load(kModels + "tiny-qwen2");  // Has q/k/v biases, tied head.
  REQUIRE(weights.ok());
  Transformer model(*config);
  auto status = LoadWeights(model, *weights);
  REQUIRE_FALSE(status.ok());
  const std::string message(status.message());
  CHECK_THAT(message, Catch::Contains("missing: lm_head.weight"));
  CHECK_THAT(message, Catch::Contains("unexpected: model.layers.0.self_attn.k_proj.bias"));

  // A Llama-2-era checkpoint's rotary frequencies (a buffer, computed here from rope_theta) are
  // no mismatch, as transformers drops them too; a stray tensor of any other name is.
  testing::TempDir dir;
  const auto with = [&](const std::string& extra) {
    auto llama = StateDict::Load(kModels + "tiny-llama");
    REQUIRE(llama.ok());
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const std::string& name : llama->names()) tensors.emplace_back(name, *llama->Get(name));
    tensors.emplace_back(extra, at::ones({4}));
    const std::string path = dir.path() + "/model.safetensors";
    REQUIRE(WriteSafetensors(path, tensors).ok());
    auto loaded = StateDict::Load(path);
    REQUIRE(loaded.ok());
    Transformer fresh(*config);
    return LoadWeights(fresh, *loaded);
  };
  CHECK(with("model.layers.0.self_attn.rotary_emb.inv_freq").ok());
  CHECK_THAT(std::string(with("model.layers.0.self_attn.rotary_emb.scale").message()),
             Catch::Contains("unexpected: model.layers.0.self_attn.rotary_emb.scale"));

  ModelConfig wide = *config;
  wide.intermediate_size = 64;
  Transformer narrow_model(wide);
  auto mismatch = LoadWeights(narrow_model, *StateDict::Load(kModels + "tiny-llama"));
  REQUIRE_FALSE(mismatch.ok());
  CHECK_THAT(std::string(mismatch.message()),
             Catch::Contains("wrong shape: ") &&
                 Catch::Contains("model.layers.0.mlp.down_proj.weight (file [64, 160], model "
                                 "[64, 64])"));
}

TEST_CASE("EOS and pad ids come from generation_config.json when present", "[model]") {
  auto qwen2 = LoadModelConfig(kModels + "tiny-qwen2");
  REQUIRE(qwen2.ok());
  CHECK(qwen2->eos_token_ids == std::vector<int64_t>{511, 509});
  CHECK(qwen2->pad_token_id == 509);
  auto rm = LoadModelConfig(kModels + "tiny-qwen2-rm");
  REQUIRE(rm.ok());
  CHECK(rm->head == HeadKind::kSequenceScore);
  CHECK(rm->pad_token_id == 0);
}

TEST_CASE("StateDict: shards, selection and tensor-parallel slices", "[model]") {
  auto sharded = StateDict::Load(kModels + "tiny-qwen3");  // Saved as 7 shards + index.
  REQUIRE(sharded.ok());
  CHECK(sharded->contains("model.layers.1.self_attn.q_norm.weight"));
  StateDict layer = sharded->Select("model.layers.0.");
  CHECK(layer.contains("self_attn.q_proj.weight"));
  CHECK_FALSE(layer.contains("model.norm.weight"));
  at::Tensor full = *sharded->Get("model.layers.0.self_attn.q_proj.weight");  // (128, 64)
  at::Tensor part = *sharded->Sharded("model.layers.0.self_attn.q_proj.weight", 0, 1, 2);
  CHECK(part.size(0) == 64);
  CHECK(at::equal(part, full.narrow(0, 64, 64)));
  CHECK_FALSE(sharded->Sharded("model.layers.0.self_attn.q_proj.weight", 0, 0, 3).ok());
  CHECK(absl::IsNotFound(sharded->Get("nope").status()));
}

TEST_CASE("an exported directory loads back with the same logits", "[model][export]") {
  torch::NoGradGuard no_grad;
  Transformer model = Load("tiny-qwen2");
  testing::TempDir out;
  REQUIRE(ExportHuggingFaceDirectory(model, kModels + "tiny-qwen2", out.path(), at::kFloat).ok());
  CHECK(PathExists(out.path() + "/tokenizer.json"));
  auto reloaded = LoadModel(out.path(), {});
  REQUIRE(reloaded.ok());
  Golden golden = LoadGolden("tiny-qwen2");
  at::Tensor logits =
      (*reloaded)->Logits((*reloaded)->Hidden({golden.input_ids, golden.attention_mask}));
  CHECK(MaxDiffOnTokens(logits, golden.logits, golden.attention_mask) <= 1e-4);

  // A bf16 export holds bf16 tensors and says so in config.json.
  testing::TempDir bf16;
  REQUIRE(
      ExportHuggingFaceDirectory(model, kModels + "tiny-qwen2", bf16.path(), at::kBFloat16).ok());
  auto weights = StateDict::Load(bf16.path());
  REQUIRE(weights.ok());
  CHECK(weights->Get("model.norm.weight")->scalar_type() == at::kBFloat16);
  auto config = ReadFileToString(bf16.path() + "/config.json");
  REQUIRE(config.ok());
  CHECK_THAT(*config, Catch::Contains("\"dtype\": \"bfloat16\""));
}

}  // namespace rlhfd::model

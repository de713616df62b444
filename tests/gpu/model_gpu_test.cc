// [gpu] The transformer in bf16 on the GPU against the fp32 CPU forward of every fixture:
// relative error (Frobenius norm of the difference over that of the reference) <= 1e-2. And a
// LoRA actor as a job trains it on a GPU (a frozen bf16 base, float32 adapters, under bf16
// autocast): its gradients reach every adapter and agree with float32 on the CPU.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>

#include "worker/model/lora.h"
#include "worker/model/model_loader.h"
#include "worker/model/state_dict.h"

namespace rlhfd::model {

TEST_CASE("bf16 on the GPU matches fp32 on the CPU within 1e-2 relative error", "[gpu][model]") {
  const char* env = std::getenv("RLHFD_FIXTURES_DIR");
  const std::string models = std::string(env ? env : RLHFD_FIXTURES_DIR) + "/models/";
  torch::NoGradGuard no_grad;
  for (const std::string name : {"tiny-llama", "tiny-llama3-rope", "tiny-qwen2", "tiny-qwen3",
                                 "tiny-mistral", "tiny-qwen2-rm", "tiny-llama-value"}) {
    INFO(name);
    auto golden = StateDict::Load(models + name + "/golden.safetensors");
    REQUIRE(golden.ok());
    ForwardBatch batch{golden->Get("input_ids")->clone(), golden->Get("attention_mask")->clone()};
    auto cpu = LoadModel(models + name, {at::kFloat, at::kCPU});
    const at::Device device(at::kCUDA, 0);
    auto gpu = LoadModel(models + name, {at::kBFloat16, device});
    REQUIRE(cpu.ok());
    REQUIRE(gpu.ok());
    const bool lm = (*cpu)->config().head == HeadKind::kCausalLm;
    at::Tensor reference =
        lm ? (*cpu)->Logits((*cpu)->Hidden(batch)) : (*cpu)->Scores((*cpu)->Hidden(batch));
    ForwardBatch on_gpu{batch.input_ids.to(device), batch.attention_mask.to(device)};
    at::Tensor hidden = (*gpu)->Hidden(on_gpu);
    at::Tensor out = (lm ? (*gpu)->Logits(hidden) : (*gpu)->Scores(hidden)).to(at::kFloat).cpu();
    REQUIRE((*gpu)->named_parameters()["model.layers.0.mlp.up_proj.weight"].scalar_type() ==
            at::kBFloat16);
    at::Tensor keep = batch.attention_mask.to(at::kBool).unsqueeze(-1).expand_as(reference);
    at::Tensor diff = (out - reference).masked_select(keep);
    const double relative = (diff.norm() / reference.masked_select(keep).norm()).item<double>();
    std::cout << "model_gpu: " << name << " bf16 cuda vs fp32 cpu relative error " << relative
              << ", max |diff| " << diff.abs().max().item<double>() << "\n";
    CHECK(relative <= 1e-2);
  }
}

TEST_CASE("LoRA on a frozen bf16 base trains on the GPU as float32 does on the CPU",
          "[gpu][model][lora]") {
  const char* env = std::getenv("RLHFD_FIXTURES_DIR");
  const std::string model = std::string(env ? env : RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2";
  const at::Device device(at::kCUDA, 0);
  auto cpu = LoadModel(model, {at::kFloat, at::kCPU});
  auto gpu = LoadModel(model, {at::kBFloat16, device});
  REQUIRE(cpu.ok());
  REQUIRE(gpu.ok());
  const LoraOptions options{
      .rank = 8,
      .alpha = 16,
      .layers = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  REQUIRE(AddLoraAdapters(*cpu, options, 7).ok());
  REQUIRE(AddLoraAdapters(*gpu, options, 7).ok());
  {
    // B away from zero, the same on both, so that every adapter's gradient is non-zero.
    torch::NoGradGuard no_grad;
    auto on_gpu = (*gpu)->named_parameters();
    for (auto& item : (*cpu)->named_parameters()) {
      if (!IsLoraParameter(item.key())) continue;
      item.value().normal_(0, 0.05);
      on_gpu[item.key()].copy_(item.value());
    }
  }
  const at::Tensor ids = at::arange(3, 35, at::kLong).view({2, 16});
  const auto loss = [&](Transformer& m, const at::Device& where) {
    const at::Tensor input = ids.to(where);
    const at::Tensor logits = m->Logits(m->Hidden({.input_ids = input})).to(at::kFloat);
    return at::log_softmax(logits, -1).gather(-1, input.unsqueeze(-1)).sum();
  };
  loss(*cpu, at::kCPU).backward();
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const at::Tensor gpu_loss = loss(*gpu, device);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  gpu_loss.backward();
  auto on_gpu = (*gpu)->named_parameters();
  for (auto& item : (*cpu)->named_parameters()) {
    INFO(item.key());
    if (!IsLoraParameter(item.key())) {
      CHECK_FALSE(on_gpu[item.key()].grad().defined());
      continue;
    }
    const at::Tensor expected = item.value().grad();
    const at::Tensor got = on_gpu[item.key()].grad().to(at::kCPU, at::kFloat);
    const double relative = ((got - expected).norm() / expected.norm()).item<double>();
    std::cout << "model_gpu: lora " << item.key() << " gradient relative error " << relative
              << "\n";
    CHECK(relative <= 5e-2);
  }
}

}  // namespace rlhfd::model

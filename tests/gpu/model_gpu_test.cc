// [gpu] The transformer in bf16 on the GPU against the fp32 CPU forward of every fixture:
// relative error (Frobenius norm of the difference over that of the reference) <= 1e-2.
#include <ATen/ATen.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>

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

}  // namespace rlhfd::model

// [gpu] The transformer in bf16 on the GPU against the fp32 CPU forward of every fixture:
// relative error (Frobenius norm of the difference over that of the reference) <= 1e-2. And a
// LoRA actor as a job trains it on a GPU (a frozen bf16 base, float32 adapters, under bf16
// autocast): its gradients reach every adapter and agree with float32 on the CPU. The fused
// element-wise kernels (fused_ops.h) against float64, each no further from it than ATen's chain of
// kernels it replaces; and the whole model under bf16 autocast, values and gradients, against
// float64 on the CPU.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "worker/model/fused_ops.h"
#include "worker/model/lora.h"
#include "worker/model/model_loader.h"
#include "worker/model/rope.h"
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

namespace {

// ‖a − reference‖ / ‖reference‖, in float64 on the CPU.
double RelativeError(const at::Tensor& a, const at::Tensor& reference) {
  const at::Tensor r = reference.to(at::kCPU, at::kDouble);
  return ((a.to(at::kCPU, at::kDouble) - r).norm() / r.norm()).item<double>();
}

// A fused result may be no further from float64 than the ATen chain it replaces (5 % slack for
// the order of float32 sums), or than `floor` where both are at float32's own rounding.
void CheckNoWorse(const std::string& what, const at::Tensor& fused, const at::Tensor& chain,
                  const at::Tensor& exact, double floor) {
  const double ours = RelativeError(fused, exact), theirs = RelativeError(chain, exact);
  std::cout << "model_gpu: " << what << ": fused " << ours << ", ATen chain " << theirs << "\n";
  INFO(what << ": fused " << ours << ", ATen chain " << theirs);
  CHECK(ours <= std::max(1.05 * theirs, floor));
}

std::string FunctionName(const at::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : std::string("(none)");
}

at::Tensor Leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

}  // namespace

TEST_CASE("fused SwiGLU, RMS norm and rotary kernels are no further from float64 than ATen's",
          "[gpu][model]") {
  const at::Device device(at::kCUDA, 0);
  at::manual_seed(41);
  for (const at::ScalarType type : {at::kBFloat16, at::kHalf}) {
    const std::string name = c10::toString(type);
    SECTION(std::string("SwiGLU ") + name) {
      // Sizes and offsets for each pack width the kernels pick: 8 elements a pack (1,024 columns),
      // an odd count (one element a pack) and a view one element in (2).
      for (const int64_t offset : {0, 1}) {
        for (const int64_t columns : {1024, 1001}) {
          const std::string what = "SwiGLU " + std::to_string(columns) + " columns, offset " +
                                   std::to_string(offset) + ", " + name;
          INFO(what);
          const auto make = [&](double scale) {
            return (at::randn({3, 7, columns + offset}) * scale)
                .to(device, type)
                .narrow(2, offset, columns);
          };
          const at::Tensor gate0 = make(3), up0 = make(1), grad = make(1);
          at::Tensor gate = Leaf(gate0), up = Leaf(up0);
          const at::Tensor fused = FusedSwiGlu(gate, up, type);
          CHECK(FunctionName(fused).find("SwiGluFunction") != std::string::npos);
          fused.backward(grad);
          at::Tensor gate_chain = Leaf(gate0), up_chain = Leaf(up0);
          const at::Tensor chain = at::silu(gate_chain) * up_chain;
          chain.backward(grad);
          at::Tensor gate64 = Leaf(gate0.cpu().to(at::kDouble));
          at::Tensor up64 = Leaf(up0.cpu().to(at::kDouble));
          const at::Tensor exact = at::silu(gate64) * up64;
          exact.backward(grad.cpu().to(at::kDouble));
          CHECK(fused.scalar_type() == type);
          CheckNoWorse(what, fused, chain, exact, 0);
          CheckNoWorse(what + " d/dgate", gate.grad(), gate_chain.grad(), gate64.grad(), 0);
          CheckNoWorse(what + " d/dup", up.grad(), up_chain.grad(), up64.grad(), 0);
        }
      }
    }
    SECTION(std::string("RMS norm ") + name) {
      // Widths for packs of 4, 2 and 1 elements; 65 rows (one chunk of the weight's gradient)
      // and 450 (four, the last partial).
      for (const auto& [batch, tokens] : {std::pair<int64_t, int64_t>{5, 13}, {3, 150}}) {
        for (const int64_t width : {896, 102, 99}) {
          const at::Tensor x0 = (at::randn({batch, tokens, width}) * 2).to(device);
          const at::Tensor w0 = (1 + at::randn({width}) * 0.1).to(device);
          const at::Tensor grad = at::randn({batch, tokens, width}).to(device, type);
          at::Tensor x = Leaf(x0), w = Leaf(w0);
          const at::Tensor fused = ApplyRmsNorm(x, w, 1e-6, type);
          CHECK(FunctionName(fused).find("RmsNormFunction") != std::string::npos);
          fused.backward(grad);
          at::Tensor x_chain = Leaf(x0), w_chain = Leaf(w0);
          const at::Tensor chain = at::rms_norm(x_chain, {width}, w_chain, 1e-6).to(type);
          chain.backward(grad);
          at::Tensor x64 = Leaf(x0.cpu().to(at::kDouble)), w64 = Leaf(w0.cpu().to(at::kDouble));
          const at::Tensor exact = at::rms_norm(x64, {width}, w64, 1e-6);
          exact.backward(grad.cpu().to(at::kDouble));
          const std::string what = "RMS norm " + std::to_string(batch * tokens) + " x " +
                                   std::to_string(width) + " " + name;
          INFO(what);
          CHECK(fused.scalar_type() == type);
          CheckNoWorse(what, fused, chain, exact, 0);
          CheckNoWorse(what + " d/dx", x.grad(), x_chain.grad(), x64.grad(), 1e-6);
          CheckNoWorse(what + " d/dweight", w.grad(), w_chain.grad(), w64.grad(), 1e-6);
          // A frozen weight (a LoRA base): x's gradient alone, the same.
          at::Tensor x_alone = Leaf(x0);
          ApplyRmsNorm(x_alone, w0, 1e-6, type).backward(grad);
          CHECK(at::equal(x_alone.grad(), x.grad()));
        }
      }
    }
    SECTION(std::string("residual add and norm ") + name) {
      // A layer's mid-point: the float32 residual stream plus the attention's output (in the
      // GEMMs' dtype, or float32), then the MLP's norm; the loss reads both results, so the
      // sum's own gradient (the residual path) joins the norm's.
      for (const at::ScalarType delta_type : {type, at::kFloat}) {
        for (const int64_t width : {896, 99}) {
          const std::string what = "add + norm " + std::to_string(width) + ", delta " +
                                   c10::toString(delta_type) + ", " + name;
          INFO(what);
          const at::Tensor x0 = (at::randn({3, 150, width}) * 2).to(device);
          const at::Tensor delta0 = at::randn({3, 150, width}).to(device, delta_type);
          const at::Tensor w0 = (1 + at::randn({width}) * 0.1).to(device);
          const at::Tensor sum_weights = at::randn({3, 150, width}).to(device);
          const at::Tensor norm_weights = at::randn({3, 150, width}).to(device);
          const auto loss = [&](const at::Tensor& sum, const at::Tensor& normed) {
            return (sum.to(at::kDouble) * sum_weights.to(sum.device(), at::kDouble)).sum() +
                   (normed.to(at::kDouble) * norm_weights.to(normed.device(), at::kDouble)).sum();
          };
          at::Tensor x = Leaf(x0), delta = Leaf(delta0), w = Leaf(w0);
          const auto [sum, normed] = FusedAddRmsNorm(x, delta, w, 1e-6, type);
          CHECK(FunctionName(normed).find("AddRmsNormFunction") != std::string::npos);
          CHECK(at::equal(sum, x0 + delta0));  // ATen's float32 add, bit for bit
          loss(sum, normed).backward();
          at::Tensor x_chain = Leaf(x0), delta_chain = Leaf(delta0), w_chain = Leaf(w0);
          const at::Tensor sum_chain = x_chain + delta_chain;
          const at::Tensor chain = at::rms_norm(sum_chain, {width}, w_chain, 1e-6).to(type);
          loss(sum_chain, chain).backward();
          at::Tensor x64 = Leaf(x0.cpu().to(at::kDouble));
          at::Tensor delta64 = Leaf(delta0.cpu().to(at::kDouble));
          at::Tensor w64 = Leaf(w0.cpu().to(at::kDouble));
          const at::Tensor sum64 = x64 + delta64;
          const at::Tensor exact = at::rms_norm(sum64, {width}, w64, 1e-6);
          loss(sum64, exact).backward();
          CHECK(normed.scalar_type() == type);
          CHECK(delta.grad().scalar_type() == delta_type);
          CheckNoWorse(what, normed, chain, exact, 0);
          CheckNoWorse(what + " d/dx", x.grad(), x_chain.grad(), x64.grad(), 1e-6);
          CheckNoWorse(what + " d/ddelta", delta.grad(), delta_chain.grad(), delta64.grad(), 1e-6);
          CheckNoWorse(what + " d/dweight", w.grad(), w_chain.grad(), w64.grad(), 1e-6);
        }
      }
    }
    SECTION(std::string("rotary ") + name) {
      // q and k as the slices of one joined projection (rows strided), a dense tensor, one token
      // a row, a slice one element off alignment (the kernel then reads one element at a time),
      // and a gradient arriving in attention's (B, H, T, D) layout.
      const int64_t heads = 4, kv_heads = 2, dim = 64;
      for (const int64_t tokens : {9, 1}) {
        const int64_t batch = 3;
        const at::Tensor joined =
            at::randn({batch, tokens, (heads + 2 * kv_heads) * dim}).to(device, type);
        const at::Tensor positions = at::randint(0, 4000, {batch, tokens}, at::kLong);
        RopeConfig rope;
        rope.theta = 1e6;
        auto [cos, sin] = RopeCosSin(RopeInverseFrequencies(rope, dim), positions, at::kFloat);
        cos = cos.to(device);
        sin = sin.to(device);
        const std::vector<std::pair<std::string, at::Tensor>> inputs = {
            {"q slice", joined.narrow(2, 0, heads * dim).view({batch, tokens, heads, dim})},
            {"k slice",
             joined.narrow(2, heads * dim, kv_heads * dim).view({batch, tokens, kv_heads, dim})},
            {"dense",
             joined.narrow(2, 0, heads * dim).contiguous().view({batch, tokens, heads, dim})},
            {"unaligned slice", joined.narrow(2, 1, heads * dim).unflatten(2, {heads, dim})},
        };
        for (const auto& [layout, x0] : inputs) {
          const std::string what =
              "rotary " + layout + ", " + std::to_string(tokens) + " token(s), " + name;
          INFO(what);
          const at::Tensor weights = at::randn({batch, x0.size(2), tokens, dim}).to(device, type);
          at::Tensor x = x0.detach().requires_grad_(true);
          const at::Tensor fused = FusedRope(x, cos, sin, type);
          CHECK(FunctionName(fused).find("RopeFunction") != std::string::npos);
          CHECK(fused.is_contiguous());
          (fused.transpose(1, 2).to(at::kFloat) * weights.to(at::kFloat)).sum().backward();
          at::Tensor x_chain = x0.detach().requires_grad_(true);
          const at::Tensor chain =
              ApplyRope(x_chain.transpose(1, 2), cos.to(type), sin.to(type)).to(type);
          (chain.to(at::kFloat) * weights.to(at::kFloat)).sum().backward();
          at::Tensor x64 = x0.detach().cpu().to(at::kDouble).requires_grad_(true);
          const at::Tensor exact =
              ApplyRope(x64.transpose(1, 2), cos.cpu().to(at::kDouble), sin.cpu().to(at::kDouble));
          (exact * weights.cpu().to(at::kDouble)).sum().backward();
          CheckNoWorse(what, fused.transpose(1, 2), chain, exact, 0);
          CheckNoWorse(what + " d/dx", x.grad(), x_chain.grad(), x64.grad(), 0);
        }
      }
    }
  }
}

TEST_CASE("under bf16 autocast on the GPU the whole model agrees with float64 on the CPU",
          "[gpu][model]") {
  // The actor's training forward and backward (float32 masters, bf16 autocast, the fused kernels)
  // against float64 on the CPU: logits within 3e-2 and the gradient of the whole model within
  // 5e-2 (relative), with and without activation checkpointing (which must give the same
  // gradients, to the backward's non-determinism: 1e-3). qk-norm, biases and Llama 3's rope.
  const char* env = std::getenv("RLHFD_FIXTURES_DIR");
  const std::string models = std::string(env ? env : RLHFD_FIXTURES_DIR) + "/models/";
  const at::Device device(at::kCUDA, 0);
  for (const std::string name : {"tiny-qwen3", "tiny-qwen2", "tiny-llama3-rope"}) {
    INFO(name);
    auto exact_model = LoadModel(models + name, {at::kDouble, at::kCPU});
    REQUIRE(exact_model.ok());
    at::manual_seed(43);
    const at::Tensor ids = at::randint(3, 500, {4, 37}, at::kLong);
    const auto loss_of = [&](Transformer& m, const at::Device& where, at::Tensor* logits) {
      const at::Tensor input = ids.to(where);
      *logits = m->Logits(m->Hidden({.input_ids = input})).to(at::kDouble);
      return at::log_softmax(*logits, -1)
          .narrow(1, 0, 36)
          .gather(-1, input.narrow(1, 1, 36).unsqueeze(-1))
          .sum();
    };
    const auto gradient = [](Transformer& m) {
      std::vector<at::Tensor> grads;
      for (const at::Tensor& p : m->parameters()) {
        grads.push_back(p.grad().defined() ? p.grad().to(at::kCPU, at::kDouble).flatten()
                                           : at::zeros({p.numel()}, at::kDouble));
      }
      return at::cat(grads);
    };
    at::Tensor exact_logits;
    loss_of(*exact_model, at::kCPU, &exact_logits).backward();
    const at::Tensor exact_gradient = gradient(*exact_model);
    std::vector<at::Tensor> gradients;
    for (const bool checkpointing : {false, true}) {
      auto gpu = LoadModel(models + name, {at::kFloat, device});
      REQUIRE(gpu.ok());
      (*gpu)->set_activation_checkpointing(checkpointing);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      at::Tensor logits;
      const at::Tensor loss = loss_of(*gpu, device, &logits);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
      loss.backward();
      const double logit_error = RelativeError(logits, exact_logits);
      gradients.push_back(gradient(*gpu));
      const double gradient_error = RelativeError(gradients.back(), exact_gradient);
      std::cout << "model_gpu: " << name << " bf16 autocast (checkpointing " << checkpointing
                << "): logits " << logit_error << ", gradient " << gradient_error
                << " relative to float64\n";
      CHECK(logit_error <= 3e-2);
      CHECK(gradient_error <= 5e-2);
    }
    CHECK(RelativeError(gradients[1], gradients[0]) <= 1e-3);
  }
}

TEST_CASE("the fused kernels serve a layer's bf16 GEMM inputs on the GPU", "[gpu][model]") {
  // The wiring: where the GEMMs compute in bf16 on a GPU, the norm writes their input and the
  // gated activation is one kernel (the autograd functions of fused_ops.cc ran).
  const at::Device device(at::kCUDA, 0);
  const at::Tensor x = at::randn({2, 5, 64}, device).requires_grad_(true);
  const at::Tensor norm = ApplyRmsNorm(x, at::ones({64}, device), 1e-6, at::kBFloat16);
  CHECK(norm.scalar_type() == at::kBFloat16);
  CHECK(FunctionName(norm).find("RmsNormFunction") != std::string::npos);
  const at::Tensor gate = at::randn({96, 64}, device).to(at::kBFloat16);
  const at::Tensor up = at::randn({96, 64}, device).to(at::kBFloat16);
  const at::Tensor hidden = GatedActivation(gate, at::Tensor(), up, at::Tensor(), norm);
  CHECK(hidden.scalar_type() == at::kBFloat16);
  CHECK(FunctionName(hidden).find("SwiGluFunction") != std::string::npos);
  // The residual add before the MLP's norm is one kernel with that norm.
  RmsNorm post_attention(64, 1e-6);
  post_attention->to(device);
  const auto [sum, normed] =
      post_attention->AddThenForward(x, hidden.narrow(-1, 0, 64).contiguous(), at::kBFloat16);
  CHECK(sum.scalar_type() == at::kFloat);
  CHECK(FunctionName(normed).find("AddRmsNormFunction") != std::string::npos);
  // On the CPU the chain of ATen kernels runs.
  const at::Tensor on_cpu =
      ApplyRmsNorm(x.detach().cpu().requires_grad_(true), at::ones({64}), 1e-6, at::kBFloat16);
  CHECK(on_cpu.scalar_type() == at::kBFloat16);
  CHECK(FunctionName(on_cpu).find("RmsNormFunction") == std::string::npos);
}

}  // namespace rlhfd::model

// Learning-rate schedules, the fused AdamW against LibTorch's own with global-norm clipping, and
// verl's MFU pieces (FLOPs estimate, device peaks).
#include "worker/train/optimizer.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <catch2/catch.hpp>
#include <vector>

#include "worker/model/model_loader.h"
#include "worker/train/flops_estimate.h"
#include "worker/train/lr_schedule.h"

namespace rlhfd::train {
namespace {

TEST_CASE("learning-rate schedules: warm-up, constant, cosine, linear", "[train][lr]") {
  v1::TrainSpec train;
  train.set_lr(1e-3);
  train.set_lr_warmup_steps(10);
  train.set_min_lr_ratio(0.1);
  train.set_lr_schedule(v1::LR_SCHEDULE_CONSTANT);
  LrSchedule constant(train, 110);
  CHECK(constant.At(0) == 0.0);
  CHECK(constant.At(5) == Approx(5e-4));
  CHECK(constant.At(10) == Approx(1e-3));
  CHECK(constant.At(109) == Approx(1e-3));
  train.set_lr_schedule(v1::LR_SCHEDULE_COSINE);
  LrSchedule cosine(train, 110);
  // Halfway through the 100 decay steps: 0.1 + 0.9 · ½(1 + cos(π/2)) = 0.55 of the peak.
  CHECK(cosine.At(60) == Approx(0.55e-3));
  CHECK(cosine.At(110) == Approx(1e-4));
  CHECK(cosine.At(500) == Approx(1e-4));  // Past the end stays at the floor.
  train.set_lr_schedule(v1::LR_SCHEDULE_LINEAR);
  LrSchedule linear(train, 110);
  CHECK(linear.At(35) == Approx(1e-3 * (0.1 + 0.9 * 0.75)));
}

TEST_CASE("fused AdamW matches LibTorch's own AdamW; clipping bounds the global norm",
          "[train][optimizer]") {
  at::manual_seed(5);
  std::vector<at::Tensor> ours, reference;
  for (auto shape :
       {std::vector<int64_t>{7, 3}, std::vector<int64_t>{11}, std::vector<int64_t>{2, 2, 2}}) {
    at::Tensor init = at::randn(shape);
    ours.push_back(init.clone().set_requires_grad(true));
    reference.push_back(init.clone().set_requires_grad(true));
  }
  AdamW optimizer(ours, {0.9, 0.95, 1e-8, 0.1});
  torch::optim::AdamW libtorch(
      reference, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < ours.size(); ++i) {
      at::Tensor grad = at::randn(ours[i].sizes());
      ours[i].mutable_grad() = grad.clone();
      reference[i].mutable_grad() = grad.clone();
    }
    optimizer.Step(1e-2);
    libtorch.step();
  }
  for (size_t i = 0; i < ours.size(); ++i) {
    CHECK((ours[i] - reference[i]).abs().max().item<double>() <= 1e-6);
  }

  // Global norm of gradients (3, 4) and (12): sqrt(9 + 16 + 144) = 13; clipped to 6.5.
  ours[0].mutable_grad() = at::zeros({7, 3});
  ours[0].mutable_grad()[0][0] = 3.0;
  ours[0].mutable_grad()[1][0] = 4.0;
  ours[1].mutable_grad() = at::zeros({11});
  ours[1].mutable_grad()[0] = 12.0;
  ours[2].mutable_grad().reset();
  CHECK(optimizer.ClipGradNorm(6.5) == Approx(13.0));
  CHECK(optimizer.ClipGradNorm(0.0) == Approx(6.5).epsilon(1e-5));
  optimizer.ZeroGrad();
  CHECK_FALSE(ours[0].grad().defined());
}

// verl's MFU pieces (verl/utils/flops_counter.py, 0.9.1): _estimate_qwen2_flops of this config
// over sequences of 3 and 5 tokens is 66,240 FLOPs (run there: 6 x 1,312 dense x 8 tokens +
// 6 x 34 x 4 x 2 x 2), and get_device_flops' figures by device name.
TEST_CASE("MFU: verl's FLOPs estimate and device peaks", "[train][mfu]") {
  model::ModelConfig config;
  config.hidden_size = 8;
  config.vocab_size = 10;
  config.num_layers = 2;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.intermediate_size = 16;
  config.head_dim = 4;
  CHECK(TrainingFlops(config, {3, 5}) == 66240.0);
  CHECK(TrainingFlops(config, {}) == 0.0);
  CHECK(PromisedFlops("NVIDIA H200") == 989e12);
  CHECK(PromisedFlops("NVIDIA H20") == 148e12);
  CHECK(PromisedFlops("NVIDIA H100 80GB HBM3") == 989e12);
  CHECK(PromisedFlops("NVIDIA L40S") == 362.05e12);
  CHECK(PromisedFlops("CPU") == 448e9);
  CHECK(PromisedFlops("NVIDIA GeForce GTX 1080") == 0);
}

}  // namespace
}  // namespace rlhfd::train

// Model FLOPs utilisation in verl's definition (verl/utils/flops_counter.py): the FLOPs a
// forward and backward of the dense weights and the attention over the batch's valid tokens take,
// against the device's promised dense bf16 peak.
#pragma once

#include <string_view>
#include <vector>

#include "worker/model/model_config.h"

namespace rlhfd::train {

// Forward + backward FLOPs of one pass over sequences of `lengths` valid tokens (verl's
// _estimate_qwen2_flops, which it uses for Llama, Qwen2/3 and Mistral: 6 x the dense weights
// x tokens, plus 6 x sum(length^2) x head_dim x heads x layers for attention).
double TrainingFlops(const model::ModelConfig& config, const std::vector<int64_t>& lengths);

// The promised peak FLOP/s of a device by the name CUDA reports ("NVIDIA H200"; "CPU" for the
// host), from verl's table; 0 when the device is not in it (verl then reports an MFU of 0).
double PromisedFlops(std::string_view device_name);

}  // namespace rlhfd::train

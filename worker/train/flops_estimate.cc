#include "worker/train/flops_estimate.h"

#include <algorithm>
#include <utility>

namespace rlhfd::train {

double TrainingFlops(const model::ModelConfig& config, const std::vector<int64_t>& lengths) {
  const double hidden = static_cast<double>(config.hidden_size);
  const double head_dim = static_cast<double>(config.head_dim);
  const double q = static_cast<double>(config.num_heads) * head_dim;
  const double kv = static_cast<double>(config.num_kv_heads) * head_dim;
  const double layers = static_cast<double>(config.num_layers);
  const double mlp = hidden * static_cast<double>(config.intermediate_size) * 3;
  const double attention_linear = hidden * (q + 2 * kv + q);
  // verl counts the embedding and the LM head as two matrices, tied or not.
  const double embedding_and_head = static_cast<double>(config.vocab_size) * hidden * 2;
  const double dense = (mlp + attention_linear) * layers + embedding_and_head;
  double tokens = 0, squares = 0;
  for (const int64_t length : lengths) {
    tokens += static_cast<double>(length);
    squares += static_cast<double>(length) * static_cast<double>(length);
  }
  return 6 * dense * tokens +
         6 * squares * head_dim * static_cast<double>(config.num_heads) * layers;
}

double PromisedFlops(std::string_view device_name) {
  // verl's _DEVICE_FLOPS, searched as verl does (keys in reverse lexical order, first one that
  // the name contains: "H200" before "H20").
  static const std::pair<std::string_view, double> kTable[] = {
      {"CPU", 448e9},           {"GB200", 2.5e15},   {"B200", 2.25e15},       {"MI300X", 1307e12},
      {"MI350X", 2300e12},      {"MI355X", 2500e12}, {"H100", 989e12},        {"H800", 989e12},
      {"H200", 989e12},         {"A100", 312e12},    {"A800", 312e12},        {"L40S", 362.05e12},
      {"L40", 181.05e12},       {"A40", 149.7e12},   {"L20", 119.5e12},       {"H20", 148e12},
      {"910B", 354e12},         {"A2G3", 354e12},    {"Ascend950DT", 432e12}, {"Ascend910", 354e12},
      {"RTX 3070 Ti", 21.75e12}};
  std::vector<std::pair<std::string_view, double>> sorted(std::begin(kTable), std::end(kTable));
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a > b; });
  for (const auto& [key, flops] : sorted) {
    if (device_name.find(key) != std::string_view::npos) return flops;
  }
  return 0;
}

}  // namespace rlhfd::train

#include "common/models/architectures.h"

namespace rlhfd::models {

std::optional<Architecture> FindArchitecture(std::string_view name) {
  for (const auto& family : kFamilies) {
    if (name.substr(0, family.prefix.size()) != family.prefix) continue;
    for (const auto& head : kHeads) {
      if (name.substr(family.prefix.size()) == head.suffix) {
        return Architecture{.family = family.family, .head = head.head};
      }
    }
  }
  return std::nullopt;
}

std::string SupportedArchitectures() {
  std::string text;
  for (size_t i = 0; i < std::size(kFamilies); ++i) {
    text.append(i == 0 ? "" : ", ").append(kFamilies[i].prefix);
  }
  text.append(" with ");
  for (size_t i = 0; i < std::size(kHeads); ++i) {
    text.append(i == 0 ? "" : (i + 1 == std::size(kHeads) ? " or " : ", "))
        .append(kHeads[i].suffix);
  }
  return text;
}

std::string QuantizedRefusal(const nlohmann::json& config) {
  if (!config.is_object()) return "";
  const auto quantized = config.find("quantization_config");
  if (quantized == config.end() || quantized->is_null()) return "";
  const auto method = quantized->is_object() ? quantized->find("quant_method") : quantized->end();
  const std::string name = method != quantized->end() && method->is_string()
                               ? method->get<std::string>().substr(0, 40)
                               : std::string("quantization_config");
  return "the checkpoint is quantized (" + name +
         "): give the unquantized model (bf16, fp16 or fp32 weights)";
}

}  // namespace rlhfd::models

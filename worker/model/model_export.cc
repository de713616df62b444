// Hugging Face directory export.
#include "worker/model/model_export.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "worker/model/lora.h"
#include "worker/model/safetensors_writer.h"

namespace rlhfd::model {

absl::Status ExportHuggingFaceDirectory(Transformer& model, const std::string& source_dir,
                                        const std::string& out_dir, at::ScalarType dtype) {
  RETURN_IF_ERROR(MakeDirectories(out_dir));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // An adapted model exports its merged weights, as PEFT's merge_and_unload gives them.
  for (const auto& [name, tensor] : MergedParameters(model)) {
    tensors.emplace_back(name, tensor.detach().to(dtype));
  }
  RETURN_IF_ERROR(WriteSafetensors(out_dir + "/model.safetensors", tensors));
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "chat_template.jinja",
                           "special_tokens_map.json"}) {
    const std::string from = absl::StrCat(source_dir, "/", name);
    if (!PathExists(from)) continue;
    ASSIGN_OR_RETURN(std::string contents, ReadFileToString(from, 256 << 20));
    if (std::string(name) == "config.json") {
      // Record the dtype the weights are now in, as transformers does.
      nlohmann::json config = nlohmann::json::parse(contents, nullptr, false);
      if (config.is_object()) {
        const char* dtype_name = dtype == at::kBFloat16 ? "bfloat16"
                                 : dtype == at::kHalf   ? "float16"
                                                        : "float32";
        config["dtype"] = dtype_name;
        if (config.contains("torch_dtype")) config["torch_dtype"] = dtype_name;
        contents = config.dump(2);
      }
    }
    RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(out_dir, "/", name), contents));
  }
  return absl::OkStatus();
}

}  // namespace rlhfd::model

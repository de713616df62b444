// For sft_template_parity.py: trainer.mode sft's rows as rlhfd makes them from a data file. The
// controller's reader (PromptData::Load, conversations) and the worker's encoding (EncodePrompt
// with the row's tools, EncodeTarget) on the model's tokenizer, no multi_turn:
//   encode_conversations MODEL_DIR DATA_FILE [PROMPT_KEY RESPONSE_KEY]
// (with the keys, single-turn rows: data.prompt_key and data.response_key) writes one JSON line per
// row: {"prompt": text, "prompt_ids": [...], "target_ids": [...], "mask": [...]}, or {"error":
// message} for a row either refuses. Exit 1 when the file or the tokenizer does not load.
#include <iostream>
#include <string>

#include "controller/driver/prompt_data.h"
#include "nlohmann/json.hpp"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/supervised_rows.h"

int main(int argc, char** argv) {
  using namespace rlhfd;
  if (argc != 3 && argc != 5) {
    std::cerr << "usage: encode_conversations MODEL_DIR DATA_FILE [PROMPT_KEY RESPONSE_KEY]\n";
    return 2;
  }
  v1::JobSpec spec;
  spec.mutable_model()->set_path(argv[1]);
  spec.mutable_data()->set_tools_key("tools");
  spec.mutable_data()->set_enable_thinking_key("enable_thinking");
  if (argc == 5) {
    spec.mutable_data()->set_prompt_key(argv[3]);
    spec.mutable_data()->set_response_key(argv[4]);
  }
  spec.mutable_data()->set_max_prompt_length(1 << 20);
  spec.mutable_data()->set_max_response_length(1 << 20);
  spec.mutable_data()->set_truncation(v1::TRUNCATION_ERROR);
  spec.mutable_roles()
      ->mutable_actor()
      ->mutable_rollout()
      ->mutable_multi_turn()
      ->set_tool_response_truncate_side("middle");
  absl::StatusOr<model::Tokenizer> tokenizer = roles::LoadJobTokenizer(spec);
  absl::StatusOr<controller::PromptData> data =
      controller::PromptData::Load({argv[2]}, spec.data(), controller::RowKind::kConversation);
  if (!tokenizer.ok() || !data.ok()) {
    std::cerr << (tokenizer.ok() ? data.status() : tokenizer.status()) << "\n";
    return 1;
  }
  for (int64_t i = 0; i < data->size(); ++i) {
    const absl::StatusOr<roles::EncodedPrompt> prompt =
        roles::EncodePrompt(*tokenizer, data->row(i), spec.data(), i);
    const absl::StatusOr<rollout::Completion> target =
        prompt.ok() ? roles::EncodeTarget(*tokenizer, data->row(i), spec, i)
                    : absl::StatusOr<rollout::Completion>(prompt.status());
    if (!target.ok()) {
      std::cout << nlohmann::json{{"error", target.status().message()}}.dump() << "\n";
      continue;
    }
    std::cout << nlohmann::json{{"prompt", prompt->text},
                                {"prompt_ids", prompt->ids},
                                {"target_ids", target->token_ids},
                                {"mask", target->response_mask}}
                     .dump()
              << "\n";
  }
  return 0;
}

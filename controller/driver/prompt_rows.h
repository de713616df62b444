// One row of a data file as the workers get it (v1::PromptRow), from its JSON object (a JSONL
// line, or a Parquet row as parquet_rows.h gives it): a prompt (text or chat turns), or
// trainer.mode sft's conversation split into prompt and target, with its tools, ground truth,
// data source and extra_info, under the job's keys (data.prompt_key...). prompt_data.h reads the
// files.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/config_document.h"
#include "controller/driver/prompt_data.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

// A data row keeps its keys' order: a chat template prints a tool call's arguments and a tool
// schema in it.
using RowJson = nlohmann::ordered_json;

// A line may be as large as a long document; the whole data set is held in memory.
inline constexpr size_t kMaxLineBytes = 16 << 20;

// The bounds one JSONL line (or JSON text in a cell) is parsed within.
config::DocumentLimits JsonlLimits();

// Where a row's parts are: data.prompt_key and data.answer_key; for conversations,
// data.messages_key and data.tools_key, or with data.response_key a single-turn row (its prompt
// under data.prompt_key).
struct RowKeys {
  RowKeys(const v1::DataSpec& data, RowKind kind);

  // The Parquet columns a row is made of: the first part of each key.
  std::vector<std::string> Columns() const;

  bool conversation;
  std::string response;  // a single-turn row's response, or ""
  std::string prompt, answer;
  std::string tools;            // "" when rows list no tools
  std::string enable_thinking;  // "" when rows carry none
};

// The row `row` of a data file (`where` names it) as the workers get it: a prompt under
// keys.prompt, or a conversation under it (with its tools). INVALID_ARGUMENT naming `where` and
// the key for what PromptData::Load lists (prompt_data.h).
absl::StatusOr<v1::PromptRow> PromptOf(const RowJson& row, const std::string& where,
                                       const RowKeys& keys);

}  // namespace rlhfd::controller

// A job's prompts, read by the controller from Parquet files as verl's data preprocessing
// writes them (*.parquet; parquet_rows.h) or from JSONL files: the prompt as text or a chat (a
// list of {role, content}) under data.prompt_key, the reference answer under data.answer_key (a
// dotted path; by default ground_truth, else reward_model.ground_truth), an optional
// data_source and an optional extra_info object (for Python reward functions and remote
// rewards). Each row remembers its file and line (a Parquet file's row) for errors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

// The most one row may carry to the workers (its prompt, ground truth and data source); a line
// of the file may be larger (columns nobody reads), up to the parser's bound.
inline constexpr int64_t kMaxRowBytes = 1 << 20;

struct PromptOrigin {
  std::string file;
  int64_t line = 0;  // a JSONL file's line, or a Parquet file's row, from 1
};

// Whether `file` is read as Parquet (its name ends in .parquet) rather than JSONL.
bool IsParquetFile(const std::string& file);

// What a data file's rows are: prompts (data.prompt_key), or, for trainer.mode sft's training
// files, conversations (data.messages_key, verl's multi-turn SFT layout: OpenAI tool_calls on
// assistant turns, the row's tool schemas under data.tools_key) split into the prompt (the turns
// before the first assistant turn) and the target (the assistant turns from it on and the user
// and tool turns between them); with data.response_key, single-turn rows (verl's SFTDataset):
// the prompt under data.prompt_key (text as a user turn, or a chat) and the response text as the
// one assistant turn. Keys keep the file's order, which the chat template prints.
enum class RowKind { kPrompt, kConversation };

// What the job's training files hold (conversations in trainer.mode sft).
RowKind TrainingRows(const v1::JobSpec& spec);
// What its validation files hold: conversations where it validates by their loss
// (algorithms::ValidatesByLoss), else prompts.
RowKind ValidationRows(const v1::JobSpec& spec);

// The reward rule that scores rows of `kind` for `spec`: roles.reward.rule where a rule (not a
// reward model or service) scores them and they are prompts (conversations are not scored);
// "" when none does.
std::string ScoringRule(const v1::JobSpec& spec, RowKind kind);

// The rows of a data file submission reads (Parquet: the first rows decoded together).
inline constexpr int64_t kHeadRows = 16;

// What submission checks of a data file, in well under a second whatever its size: a Parquet
// file opens, every row group's metadata is whole (its column chunks lie inside the file) and its
// first kHeadRows rows decode (a page over the reader's memory cap is refused, not read); a JSONL
// file's first row (a line of at most 16 MiB) and those after it within its first MiB, up to
// kHeadRows, are JSON objects. A file without rows is refused. Each of those rows makes a
// prompt under `data`'s keys, and, when `reward_rule` (roles.reward.rule) is set, picks a rule
// (auto: by its data_source) whose ground truth it holds (config::ReadGroundTruth, as the worker
// reads it). Every row is read when the job starts. Errors as PromptData::Load's, naming the
// file and row (line).
absl::Status CheckDataHead(const std::string& file, const v1::DataSpec& data,
                           const std::string& reward_rule, RowKind kind = RowKind::kPrompt);

// A quarter of the machine's memory: the controller holds every row of a data set (and, while
// it measures them, a copy).
int64_t DefaultMaxDataBytes();

// What a data set may decode to (PromptData::Load).
struct DataBounds {
  int64_t max_bytes = DefaultMaxDataBytes();  // its rows, in all
  // A file's rows, past their first `expansion_floor_bytes`, may decode to at most
  // `max_expansion` times the file's size: a few KB of dictionary-encoded Parquet can say 20 GB
  // of rows.
  int64_t expansion_floor_bytes = int64_t{1} << 30;
  int64_t max_expansion = 1000;
};

class PromptData {
 public:
  // NOT_FOUND for a file that cannot be opened; INVALID_ARGUMENT naming file:line for a line
  // (or Parquet row) that is not a JSON object, whose prompt is neither text nor a chat, or whose
  // row is over kMaxRowBytes (naming the key that takes the most), and for a Parquet file that
  // does not decode (naming the row group or column). Conversations: INVALID_ARGUMENT for one
  // that is not a list of {role, content} turns, has no assistant turn, starts with one, ends in
  // another turn, has two in a row, or has turns after its first assistant turn other than
  // assistant, user and tool turns; for tool_calls on another turn than an assistant's, or not
  // in OpenAI's layout (a name and an arguments object, or JSON text holding one); for tools
  // (data.tools_key) that are not a list of objects (or JSON text holding one); for an
  // extra_info that is not an object (or JSON text holding one). With `reward_rule` (a
  // ScoringRule), every row must pick a rule whose ground truth it holds, as CheckDataHead's
  // rows must. Rows over `bounds` are refused naming the file and row where they were crossed.
  static absl::StatusOr<PromptData> Load(const std::vector<std::string>& files,
                                         const v1::DataSpec& data, RowKind kind = RowKind::kPrompt,
                                         const std::string& reward_rule = "",
                                         const DataBounds& bounds = DataBounds());

  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  const v1::PromptRow& row(int64_t index) const { return rows_[index]; }
  const PromptOrigin& origin(int64_t index) const { return origins_[index]; }

  // The row order of epoch `epoch` (from 0): a permutation seeded by shuffle_seed and the epoch
  // when `shuffle`, else file order. The same on every run and after every resume.
  std::vector<int64_t> EpochOrder(int64_t epoch, bool shuffle, int64_t shuffle_seed) const;

  // Keeps the rows whose `tokens` (one per row) are at most `limit`; the number dropped.
  int64_t KeepAtMost(const std::vector<int64_t>& tokens, int64_t limit);

 private:
  std::vector<v1::PromptRow> rows_;
  std::vector<PromptOrigin> origins_;
};

// OK if any `per_call` rows of `data` fit one stage call of `limit_bytes` (a rank's share of a
// step or of a validation travels in one); else INVALID_ARGUMENT for `what` (the data key),
// naming the largest row's file and line and the ways to fix it.
absl::Status CheckShareFits(const PromptData& data, int64_t per_call, int64_t limit_bytes,
                            const std::string& what);

// Which rows step `step` (from 1) trains on: batch (step - 1) of `batch_size` rows, epochs of
// size / batch_size whole batches (the remainder of an epoch is not used, as verl's
// drop_last), each epoch in EpochOrder.
struct StepRows {
  int64_t epoch = 0;
  int64_t batch = 0;  // within the epoch
  std::vector<int64_t> rows;
};
StepRows RowsOfStep(const PromptData& data, int64_t step, int64_t batch_size, bool shuffle,
                      int64_t shuffle_seed);

}  // namespace rlhfd::controller

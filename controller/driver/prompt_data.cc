#include "controller/driver/prompt_data.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/config_document.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "controller/driver/parquet_rows.h"

namespace rlhfd::controller {
namespace {

// A line may be as large as a long document; the whole data set is held in memory.
constexpr size_t kMaxLineBytes = 16 << 20;
constexpr int64_t kMaxRows = 50'000'000;

const nlohmann::json* Find(const nlohmann::json& row, const std::string& dotted) {
  const nlohmann::json* at = &row;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(dotted, '.'))) {
    if (!at->is_object()) return nullptr;
    const auto found = at->find(part);
    if (found == at->end()) return nullptr;
    at = &*found;
  }
  return at;
}

}  // namespace

namespace {

// The row `row` of a data file (`where` names it) as the workers get it.
absl::StatusOr<v1::PromptRow> PromptOf(const nlohmann::json& row, const std::string& where,
                                       const std::string& prompt_key,
                                       const std::string& answer_key) {
  if (!row.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a row must be a JSON object"));
  }
  v1::PromptRow prompt;
  const nlohmann::json* value = Find(row, prompt_key);
  if (value != nullptr && value->is_string()) {
    prompt.set_text(value->get<std::string>());
  } else if (value != nullptr && value->is_array() && !value->empty()) {
    for (const nlohmann::json& turn : *value) {
      const auto role = turn.is_object() ? turn.find("role") : turn.end();
      const auto content = turn.is_object() ? turn.find("content") : turn.end();
      if (!turn.is_object() || role == turn.end() || !role->is_string() || content == turn.end() ||
          !content->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", prompt_key,
                         " must be text or a list of {\"role\": ..., \"content\": ...} turns"));
      }
      v1::ChatTurn* added = prompt.add_chat();
      added->set_role(role->get<std::string>());
      added->set_content(content->get<std::string>());
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no prompt under '", prompt_key,
                     "' (data.prompt_key): give text or a list of {role, content} turns"));
  }
  const nlohmann::json* truth = Find(row, answer_key);
  // The default key falls back on verl's layout.
  if (truth == nullptr && answer_key == "ground_truth") {
    truth = Find(row, "reward_model.ground_truth");
  }
  if (truth != nullptr && !truth->is_null()) {
    prompt.set_ground_truth_json(
        truth->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (const nlohmann::json* source = Find(row, "data_source");
      source != nullptr && source->is_string()) {
    prompt.set_data_source(source->get<std::string>());
  }
  // verl's extra_info column, for Python reward functions and remote rewards.
  if (const nlohmann::json* extra = Find(row, "extra_info");
      extra != nullptr && extra->is_object()) {
    prompt.set_extra_info_json(
        extra->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (const int64_t bytes = static_cast<int64_t>(prompt.ByteSizeLong()); bytes > kMaxRowBytes) {
    const int64_t truth_bytes = static_cast<int64_t>(prompt.ground_truth_json().size());
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the row carries ", bytes, " bytes to the workers, over the ", kMaxRowBytes,
        " a row may; the most is under '", truth_bytes > bytes / 2 ? answer_key : prompt_key, "' (",
        truth_bytes > bytes / 2 ? truth_bytes : bytes - truth_bytes,
        " bytes): shorten it, or leave the row out"));
  }
  return prompt;
}

// Each non-blank line of a JSONL file, numbered from 1.
absl::Status ReadJsonlRows(const std::string& file,
                           const std::function<absl::Status(int64_t, nlohmann::json)>& visit) {
  std::ifstream in(file);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("data file ", file,
                     " cannot be read (data.train_files / val_files): it must exist on "
                     "the controller's machine"));
  }
  config::DocumentLimits limits;
  limits.max_text_bytes = kMaxLineBytes;
  limits.max_depth = 64;
  limits.max_values = 1'000'000;
  limits.max_scalar_bytes = kMaxLineBytes;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(file, ":", line);
    if (text.size() > kMaxLineBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the line is longer than ", kMaxLineBytes, " bytes"));
    }
    absl::StatusOr<nlohmann::json> row = config::ParseBoundedJson(text, where, limits);
    if (!row.ok()) return row.status();
    RETURN_IF_ERROR(visit(line, *std::move(row)));
  }
  return absl::OkStatus();
}

// Where a row's parts are: data.prompt_key and data.answer_key with their defaults.
struct RowKeys {
  explicit RowKeys(const v1::DataSpec& data)
      : prompt(data.prompt_key().empty() ? "prompt" : data.prompt_key()),
        answer(data.answer_key().empty() ? "ground_truth" : data.answer_key()) {}

  // The Parquet columns a row is made of: the first part of each key.
  std::vector<std::string> Columns() const {
    return {prompt.substr(0, prompt.find('.')), answer.substr(0, answer.find('.')), "reward_model",
            "data_source", "extra_info"};
  }

  std::string prompt, answer;
};

}  // namespace

bool IsParquetFile(const std::string& file) { return absl::EndsWith(file, ".parquet"); }

absl::Status CheckFirstParquetRow(const std::string& file, const v1::DataSpec& data) {
  const RowKeys keys(data);
  const absl::Status read =
      ReadParquetRows(file, keys.Columns(), [&](int64_t row, nlohmann::json object) {
        RETURN_IF_ERROR(
            PromptOf(object, absl::StrCat(file, ":", row), keys.prompt, keys.answer).status());
        return absl::CancelledError("the first row is enough");
      });
  return absl::IsCancelled(read) ? absl::OkStatus() : read;
}

absl::StatusOr<PromptData> PromptData::Load(const std::vector<std::string>& files,
                                            const v1::DataSpec& data) {
  PromptData loaded;
  const RowKeys keys(data);
  for (const std::string& file : files) {
    // `line` is a JSONL file's line, or a Parquet file's row (both from 1).
    const auto add = [&](int64_t line, nlohmann::json row) -> absl::Status {
      ASSIGN_OR_RETURN(v1::PromptRow prompt,
                       PromptOf(row, absl::StrCat(file, ":", line), keys.prompt, keys.answer));
      loaded.rows_.push_back(std::move(prompt));
      loaded.origins_.push_back({file, line});
      if (loaded.size() > kMaxRows) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": more than ", kMaxRows, " prompts in all"));
      }
      return absl::OkStatus();
    };
    if (IsParquetFile(file)) {
      RETURN_IF_ERROR(ReadParquetRows(file, keys.Columns(), add));
    } else {
      RETURN_IF_ERROR(ReadJsonlRows(file, add));
    }
  }
  return loaded;
}

std::vector<int64_t> PromptData::EpochOrder(int64_t epoch, bool shuffle,
                                            int64_t shuffle_seed) const {
  std::vector<int64_t> order(rows_.size());
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  std::mt19937_64 generator(static_cast<uint64_t>(shuffle_seed) * 1000003ull +
                            static_cast<uint64_t>(epoch));
  // Fisher-Yates with the generator's raw output: std::shuffle's result differs between
  // standard libraries, and a resumed run must see the same order.
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(generator() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

int64_t PromptData::KeepAtMost(const std::vector<int64_t>& tokens, int64_t limit) {
  size_t kept = 0;
  for (size_t i = 0; i < rows_.size(); ++i) {
    if (tokens[i] > limit) continue;
    rows_[kept] = std::move(rows_[i]);
    origins_[kept] = std::move(origins_[i]);
    ++kept;
  }
  const int64_t dropped = static_cast<int64_t>(rows_.size() - kept);
  rows_.resize(kept);
  origins_.resize(kept);
  return dropped;
}

absl::Status CheckShareFits(const PromptData& data, int64_t per_call, int64_t limit_bytes,
                            const std::string& what) {
  std::vector<std::pair<int64_t, int64_t>> sizes;  // (bytes, row), largest first
  sizes.reserve(static_cast<size_t>(data.size()));
  for (int64_t i = 0; i < data.size(); ++i) {
    sizes.emplace_back(static_cast<int64_t>(data.row(i).ByteSizeLong()), i);
  }
  const size_t taken = static_cast<size_t>(std::clamp<int64_t>(per_call, 0, data.size()));
  std::partial_sort(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(taken), sizes.end(),
                    std::greater<>());
  int64_t worst = 0;
  for (size_t i = 0; i < taken; ++i) worst += sizes[i].first;
  if (worst <= limit_bytes) return absl::OkStatus();
  const PromptOrigin& largest = data.origin(sizes[0].second);
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": a rank is sent up to ", per_call, " rows in one call, and the largest ", taken,
      " rows carry ", worst, " bytes, over the ", limit_bytes, " one call may (the largest is ",
      largest.file, ":", largest.line, ", ", sizes[0].first,
      " bytes): lower data.train_batch_size, give the actor more ranks, or shorten the rows"));
}

StepRows RowsOfStep(const PromptData& data, int64_t step, int64_t batch_size, bool shuffle,
                      int64_t shuffle_seed) {
  StepRows batch;
  const int64_t per_epoch = data.size() / batch_size;
  if (per_epoch == 0) return batch;
  batch.epoch = (step - 1) / per_epoch;
  batch.batch = (step - 1) % per_epoch;
  const std::vector<int64_t> order = data.EpochOrder(batch.epoch, shuffle, shuffle_seed);
  batch.rows.assign(order.begin() + batch.batch * batch_size,
                    order.begin() + (batch.batch + 1) * batch_size);
  return batch;
}

}  // namespace rlhfd::controller

#include "controller/driver/prompt_data.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/algorithms/supervised.h"
#include "common/config/config_document.h"
#include "common/config/reward_rules.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "controller/driver/parquet_rows.h"
#include "controller/driver/prompt_rows.h"

namespace rlhfd::controller {
namespace {

constexpr int64_t kMaxRows = 50'000'000;

using Json = RowJson;

// A UTF-8 byte order mark, which some editors start a file with (JSON's parser skips it).
constexpr absl::string_view kByteOrderMark = "\xEF\xBB\xBF";

// Each non-blank line of a JSONL file, numbered from 1.
absl::Status ReadJsonlRows(const std::string& file,
                           const std::function<absl::Status(int64_t, Json)>& visit) {
  const config::DocumentLimits limits = JsonlLimits();
  const absl::Status read =
      ReadFileLines(file, kMaxLineBytes, [&](int64_t line, absl::string_view text) -> absl::Status {
        if (line == 1) absl::ConsumePrefix(&text, kByteOrderMark);
        if (text.find_first_not_of(" \t\r") == absl::string_view::npos) return absl::OkStatus();
        ASSIGN_OR_RETURN(Json row, config::ParseBoundedJson(std::string(text),
                                                            absl::StrCat(file, ":", line), limits));
        return visit(line, std::move(row));
      });
  if (absl::IsNotFound(read)) {
    return absl::NotFoundError(
        absl::StrCat("data file ", file,
                     " cannot be read (data.train_files / val_files): it must exist on "
                     "the controller's machine"));
  }
  return read;
}

}  // namespace

bool IsParquetFile(const std::string& file) { return absl::EndsWith(file, ".parquet"); }

RowKind TrainingRows(const v1::JobSpec& spec) {
  return spec.trainer().mode() == v1::TRAINER_MODE_SFT ? RowKind::kConversation : RowKind::kPrompt;
}

RowKind ValidationRows(const v1::JobSpec& spec) {
  return algorithms::ValidatesByLoss(spec) ? RowKind::kConversation : RowKind::kPrompt;
}

namespace {

// A row of a data file's head as the worker's reward rule will read it.
absl::Status CheckRowReward(const v1::PromptRow& prompt, const std::string& where,
                            const std::string& answer_key, const std::string& reward_rule) {
  if (reward_rule.empty()) return absl::OkStatus();
  absl::StatusOr<std::string_view> rule = config::RuleForRow(reward_rule, prompt.data_source());
  if (!rule.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", rule.status().message()));
  const nlohmann::json truth =
      prompt.ground_truth_json().empty()
          ? nlohmann::json()
          : nlohmann::json::parse(prompt.ground_truth_json(), nullptr, /*allow_exceptions=*/false);
  if (absl::Status read = config::ReadGroundTruth(*rule, truth).status(); !read.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": under '", answer_key, "' (data.answer_key): ", read.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ScoringRule(const v1::JobSpec& spec, RowKind kind) {
  const v1::RewardSpec& reward = spec.roles().reward();
  // A rule the config check refused is not checked against.
  const bool rule_scores =
      reward.model().empty() && reward.remote().empty() && config::IsRewardRule(reward.rule());
  return kind == RowKind::kPrompt && rule_scores ? reward.rule() : std::string();
}

absl::Status CheckDataHead(const std::string& file, const v1::DataSpec& data,
                           const std::string& reward_rule, RowKind kind) {
  const RowKeys keys(data, kind);
  int64_t rows = 0;
  const auto check_row = [&](int64_t row, const Json& object) -> absl::Status {
    const std::string where = absl::StrCat(file, ":", row);
    ASSIGN_OR_RETURN(v1::PromptRow prompt, PromptOf(object, where, keys));
    ++rows;
    return CheckRowReward(prompt, where, keys.answer, reward_rule);
  };
  if (IsParquetFile(file)) {
    // A tighter cap than the job's start: a page too large for it (a 100 MB cell) is refused
    // before it is read, in a fraction of a second.
    const ParquetReadLimits limits{
        .max_cell_bytes = kMaxRowBytes, .max_decode_bytes = 64 << 20, .batch_rows = kHeadRows};
    const absl::Status read =
        ReadParquetRows(file, keys.Columns(), limits, [&](int64_t row, Json object) {
          RETURN_IF_ERROR(check_row(row, object));
          return row < kHeadRows ? absl::OkStatus()
                                 : absl::CancelledError("the first rows are enough");
        });
    if (!read.ok() && !absl::IsCancelled(read)) return read;
  } else {
    // The first row whatever its length (up to a line's bound), then those within the first
    // MiB: a JSON document on one line (not JSONL) is refused here, not at the job's start.
    int64_t bytes = 0;
    absl::Status refused;  // a row's, as against the file's read
    const absl::Status read = ReadFileLines(
        file, kMaxLineBytes, [&](int64_t line, absl::string_view text) -> absl::Status {
          if (line == 1) absl::ConsumePrefix(&text, kByteOrderMark);
          bytes += static_cast<int64_t>(text.size()) + 1;
          const size_t start = text.find_first_not_of(" \t\r");
          if (start == absl::string_view::npos) {
            // Blank lines count too: a file of them is not read to its end.
            if (rows > 0 && bytes >= kMaxRowBytes) {
              return absl::CancelledError("the first rows are enough");
            }
            if (rows > 0 || bytes <= kMaxLineBytes) return absl::OkStatus();
            refused = absl::InvalidArgumentError(
                absl::StrCat("'", file, "' holds no row in its first ", kMaxLineBytes, " bytes"));
            return refused;
          }
          if (rows == 0 && text[start] != '{') {
            refused = absl::InvalidArgumentError(absl::StrCat(
                "'", file, "' is not JSONL: its first row (line ", line,
                ") does not start with a JSON object ({\"prompt\": ...}; docs/data.md)"));
            return refused;
          }
          absl::StatusOr<Json> object = config::ParseBoundedJson(
              std::string(text), absl::StrCat(file, ":", line), JsonlLimits());
          refused = object.ok() ? check_row(line, *object) : object.status();
          RETURN_IF_ERROR(refused);
          return rows < kHeadRows && bytes < kMaxRowBytes
                     ? absl::OkStatus()
                     : absl::CancelledError("the first rows are enough");
        });
    if (!refused.ok()) return refused;
    if (!read.ok() && !absl::IsCancelled(read)) {
      return absl::Status(read.code(), absl::StrCat("cannot read data file: ", read.message()));
    }
  }
  if (rows == 0) return absl::InvalidArgumentError(absl::StrCat("'", file, "' holds no rows"));
  return absl::OkStatus();
}

int64_t DefaultMaxDataBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_bytes > 0 ? static_cast<int64_t>(pages) * page_bytes / 4
                                     : int64_t{4} << 30;
}

absl::StatusOr<PromptData> PromptData::Load(const std::vector<std::string>& files,
                                            const v1::DataSpec& data, RowKind kind,
                                            const std::string& reward_rule,
                                            const DataBounds& bounds) {
  PromptData loaded;
  const RowKeys keys(data, kind);
  int64_t bytes = 0;  // of every file's rows
  for (const std::string& file : files) {
    std::error_code unknown;
    const std::uintmax_t file_bytes = std::filesystem::file_size(file, unknown);
    int64_t file_rows_bytes = 0;
    // `line` is a JSONL file's line, or a Parquet file's row (both from 1).
    const auto add = [&](int64_t line, Json row) -> absl::Status {
      const std::string where = absl::StrCat(file, ":", line);
      ASSIGN_OR_RETURN(v1::PromptRow prompt, PromptOf(row, where, keys));
      // Every row, not only the head submission read: a bad one would fail the step reaching it.
      RETURN_IF_ERROR(CheckRowReward(prompt, where, keys.answer, reward_rule));
      const int64_t row_bytes = static_cast<int64_t>(prompt.ByteSizeLong());
      file_rows_bytes += row_bytes;
      bytes += row_bytes;
      if (!unknown && file_rows_bytes > bounds.expansion_floor_bytes &&
          file_rows_bytes / bounds.max_expansion > static_cast<int64_t>(file_bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the file's ", file_bytes, " bytes have decoded to ", file_rows_bytes,
            " bytes of rows so far, over ", bounds.max_expansion,
            " times their size: refused as a decompression bomb (a data set's rows are not one "
            "row repeated)"));
      }
      if (bytes > bounds.max_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the data files read so far hold ", bytes, " bytes of rows, over the ",
            bounds.max_bytes,
            " the controller holds a data set in (a quarter of its machine's memory): use fewer "
            "or smaller files, or a controller with more memory"));
      }
      loaded.rows_.push_back(std::move(prompt));
      loaded.origins_.push_back({file, line});
      if (loaded.size() > kMaxRows) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": more than ", kMaxRows, " prompts in all"));
      }
      return absl::OkStatus();
    };
    if (IsParquetFile(file)) {
      RETURN_IF_ERROR(ReadParquetRows(file, keys.Columns(),
                                      ParquetReadLimits{.max_cell_bytes = kMaxRowBytes}, add));
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

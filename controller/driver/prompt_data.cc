#include "controller/driver/prompt_data.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/algorithms/supervised.h"
#include "common/config/config_document.h"
#include "common/config/job_defaults.h"
#include "common/config/reward_rules.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/python_json.h"
#include "common/util/text.h"
#include "controller/driver/parquet_rows.h"

namespace rlhfd::controller {
namespace {

// A line may be as large as a long document; the whole data set is held in memory.
constexpr size_t kMaxLineBytes = 16 << 20;
constexpr int64_t kMaxRows = 50'000'000;

// A data row keeps its keys' order: a chat template prints a tool call's arguments and a tool
// schema in it.
using Json = nlohmann::ordered_json;

const Json* Find(const Json& row, const std::string& dotted) {
  const Json* at = &row;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(dotted, '.'))) {
    if (!at->is_object()) return nullptr;
    const auto found = at->find(part);
    if (found == at->end()) return nullptr;
    at = &*found;
  }
  return at;
}

// The bounds one JSONL line (or JSON text in a cell) is parsed within.
config::DocumentLimits JsonlLimits() {
  config::DocumentLimits limits;
  limits.max_text_bytes = kMaxLineBytes;
  limits.max_depth = 64;
  limits.max_values = 1'000'000;
  limits.max_scalar_bytes = kMaxLineBytes;
  return limits;
}

// `value`, or the JSON a text value holds: OpenAI's layout gives a call's arguments as text, and
// datasets often give a row's tools so.
absl::StatusOr<Json> JsonOfText(const Json& value) {
  if (!value.is_string()) return value;
  return config::ParseBoundedJson(value.get<std::string>(), "the text", JsonlLimits());
}

// A JSON object, or JSON text holding one (`what` names it in the error).
absl::StatusOr<Json> ObjectOf(const Json& value, const std::string& what) {
  absl::StatusOr<Json> parsed = JsonOfText(value);
  if (parsed.ok() && parsed->is_object()) return parsed;
  const std::string why = !parsed.ok()        ? std::string(parsed.status().message())
                          : value.is_string() ? absl::StrCat("text holding a ", parsed->type_name())
                                              : std::string(value.type_name());
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be a JSON object (or JSON text holding one), not ", why));
}

// An assistant turn's tool_calls in OpenAI's and verl's layout, [{"type": "function",
// "function": {"name": ..., "arguments": {...}}}] (or each {"name", "arguments"}), as the chat
// template prints them: the arguments as its `tojson` does, in the file's key order.
absl::Status ReadToolCalls(const Json& calls, const std::string& what, v1::ChatTurn& turn) {
  if (!calls.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a list of calls"));
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = absl::StrCat(what, "[", i, "]");
    const Json* call = &calls[i];
    // Parquet gives a list of both forms every field, null where a call has none.
    if (const Json* function = call->is_object() ? Find(*call, "function") : nullptr;
        function != nullptr && !function->is_null()) {
      call = function;
    }
    const Json* name = call->is_object() ? Find(*call, "name") : nullptr;
    const Json* arguments = call->is_object() ? Find(*call, "arguments") : nullptr;
    if (name == nullptr || !name->is_string() || name->get<std::string>().empty() ||
        arguments == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(at,
                       " must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                       "\"arguments\": {...}}}"));
    }
    ASSIGN_OR_RETURN(const Json object, ObjectOf(*arguments, at + " arguments"));
    v1::ChatToolCall& added = *turn.add_tool_calls();
    added.set_name(name->get<std::string>());
    added.set_arguments_json(PythonJsonDumps(object));
    // Qwen3's template prints JSON text as it is.
    if (arguments->is_string()) added.set_arguments_text(arguments->get<std::string>());
  }
  return absl::OkStatus();
}

// A list of {"role": ..., "content": ...} objects as chat turns; `key` (the file, line and key)
// and `must_be` lead the errors. An assistant turn may carry tool_calls, and then null content.
absl::StatusOr<std::vector<v1::ChatTurn>> TurnsOf(const Json& list, const std::string& key,
                                                  const std::string& must_be) {
  std::vector<v1::ChatTurn> turns;
  for (size_t index = 0; index < list.size(); ++index) {
    const Json& turn = list[index];
    const auto role = turn.is_object() ? turn.find("role") : turn.end();
    const auto content = turn.is_object() ? turn.find("content") : turn.end();
    const auto calls = turn.is_object() ? turn.find("tool_calls") : turn.end();
    // Parquet gives every turn the column, null where the turn has none.
    const bool has_calls = calls != turn.end() && !calls->is_null() && !calls->empty();
    // Beside calls, OpenAI's layout leaves content null or out.
    const bool content_ok = (content != turn.end() && content->is_string()) ||
                            (has_calls && (content == turn.end() || content->is_null()));
    if (!turn.is_object() || role == turn.end() || !role->is_string() || !content_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " ", must_be, " a list of {\"role\": ..., \"content\": ...} turns"));
    }
    v1::ChatTurn& added = turns.emplace_back();
    added.set_role(role->get<std::string>());
    if (content != turn.end() && content->is_string()) {
      added.set_content(content->get<std::string>());
    }
    // An assistant turn's reasoning (Qwen3's template prints it in a <think> block); Parquet
    // gives every turn the column, null where the turn has none.
    if (const auto reasoning = turn.find("reasoning_content");
        added.role() == "assistant" && reasoning != turn.end() && !reasoning->is_null()) {
      if (!reasoning->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(key, " (turn ", index,
                                                       ") reasoning_content must be text, not a ",
                                                       reasoning->type_name()));
      }
      added.set_reasoning_content(reasoning->get<std::string>());
    }
    if (!has_calls) continue;
    const std::string at = absl::StrCat(key, " (turn ", index, ") tool_calls");
    if (added.role() != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": only assistant turns call tools, this is a '",
                       SanitizeForDisplay(added.role(), 40), "' turn"));
    }
    RETURN_IF_ERROR(ReadToolCalls(*calls, at, added));
  }
  return turns;
}

// A conversation's tool schemas (data.tools_key): a list of objects, or that list as JSON text,
// each printed as the chat template's `tojson` prints it (the file's key order).
absl::Status ReadTools(const Json& tools, const std::string& what, v1::PromptRow& row) {
  absl::StatusOr<Json> parsed = JsonOfText(tools);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", parsed.status().message()));
  }
  const Json& list = *parsed;
  if (!list.is_array() ||
      !std::all_of(list.begin(), list.end(), [](const Json& tool) { return tool.is_object(); })) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " must be a list of tool schemas ({\"type\": \"function\", \"function\": "
                     "{...}}), or that list as JSON text"));
  }
  for (const Json& tool : list) row.add_tools_json(PythonJsonDumps(tool));
  return absl::OkStatus();
}

// A conversation's turns as trainer.mode sft's row: the prompt (`chat`), the turns before the
// first assistant turn, and the target, the rest: assistant turns, and the user and tool turns
// between them.
absl::Status SplitConversation(std::vector<v1::ChatTurn> turns, const std::string& where,
                               v1::PromptRow& row) {
  const auto first_answer = std::find_if(turns.begin(), turns.end(), [](const v1::ChatTurn& turn) {
    return turn.role() == "assistant";
  });
  const std::string at = absl::StrCat(where, ": the conversation (data.messages_key) ");
  if (first_answer == turns.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "has no assistant turn: nothing to train on"));
  }
  if (first_answer == turns.begin()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "starts with an assistant turn: give the turns it answers first"));
  }
  for (auto turn = first_answer; turn != turns.end(); ++turn) {
    const int64_t index = turn - turns.begin();
    if (turn->role() != "assistant" && turn->role() != "tool" && turn->role() != "user") {
      return absl::InvalidArgumentError(absl::StrCat(
          at, "has a '", SanitizeForDisplay(turn->role(), 40), "' turn (turn ", index,
          ") after its first assistant turn: only assistant turns and the user and tool turns "
          "between them follow it"));
    }
    if (turn->role() == "assistant" && turn + 1 != turns.end() &&
        (turn + 1)->role() == "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          at, "has assistant turns ", index, " and ", index + 1,
          " in a row: a model's turn ends at its end token unless user or tool turns follow "
          "it; join them, or put the turns between"));
    }
  }
  if (turns.back().role() != "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "ends in a ", SanitizeForDisplay(turns.back().role(), 40),
                     " turn: end it with the assistant turn that answers it"));
  }
  for (auto turn = turns.begin(); turn != turns.end(); ++turn) {
    *(turn < first_answer ? row.add_chat() : row.add_target()) = std::move(*turn);
  }
  return absl::OkStatus();
}

// `key`, or where it is unset (a DataSpec without the job defaults) the default of data.`field`.
std::string KeyOrDefault(const std::string& key, const char* field) {
  return key.empty() ? config::JobSpecDefaults()["data"][field].get<std::string>() : key;
}

// Where a row's parts are: data.prompt_key and data.answer_key; for conversations,
// data.messages_key and data.tools_key, or with data.response_key a single-turn row (its prompt
// under data.prompt_key).
struct RowKeys {
  RowKeys(const v1::DataSpec& data, RowKind kind)
      : conversation(kind == RowKind::kConversation),
        response(conversation ? data.response_key() : ""),
        prompt(conversation && response.empty() ? KeyOrDefault(data.messages_key(), "messages_key")
                                                : KeyOrDefault(data.prompt_key(), "prompt_key")),
        answer(KeyOrDefault(data.answer_key(), "answer_key")),
        // verl's single-turn SFTDataset lists no tools and reads no enable_thinking.
        tools(conversation && response.empty() ? data.tools_key() : ""),
        enable_thinking(conversation && response.empty() ? data.enable_thinking_key() : "") {}

  // The Parquet columns a row is made of: the first part of each key.
  std::vector<std::string> Columns() const {
    std::vector<std::string> columns = {prompt,       answer, "reward_model", "data_source",
                                        "extra_info", tools,  response,       enable_thinking};
    std::vector<std::string> roots;
    for (const std::string& key : columns) {
      if (!key.empty()) roots.push_back(key.substr(0, key.find('.')));
    }
    return roots;
  }

  bool conversation;
  std::string response;  // a single-turn row's response, or ""
  std::string prompt, answer;
  std::string tools;            // "" when rows list no tools
  std::string enable_thinking;  // "" when rows carry none
};

// The row `row` of a data file (`where` names it) as the workers get it: a prompt under
// keys.prompt, or a conversation under it (with its tools).
absl::StatusOr<v1::PromptRow> PromptOf(const Json& row, const std::string& where,
                                       const RowKeys& keys) {
  const std::string& prompt_key = keys.prompt;
  const std::string& answer_key = keys.answer;
  const bool conversation = keys.conversation;
  if (!row.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a row must be a JSON object"));
  }
  v1::PromptRow prompt;
  const Json* value = Find(row, prompt_key);
  // A single-turn SFT row (data.response_key): its prompt as a chat, as verl's SFTDataset
  // sends a text prompt as a user turn.
  const bool single_turn = !keys.response.empty();
  if (value != nullptr && value->is_string() && single_turn) {
    v1::ChatTurn& user = *prompt.add_chat();
    user.set_role("user");
    user.set_content(value->get<std::string>());
  } else if (value != nullptr && value->is_string() && !conversation) {
    prompt.set_text(value->get<std::string>());
  } else if (value != nullptr && value->is_array() && !value->empty()) {
    ASSIGN_OR_RETURN(std::vector<v1::ChatTurn> turns,
                     TurnsOf(*value, absl::StrCat(where, ": ", prompt_key),
                             conversation && !single_turn ? "must be" : "must be text or"));
    if (conversation && !single_turn) {
      RETURN_IF_ERROR(SplitConversation(std::move(turns), where, prompt));
    } else {
      for (v1::ChatTurn& turn : turns) *prompt.add_chat() = std::move(turn);
    }
  } else if (single_turn) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no prompt under '", prompt_key,
                     "' (data.prompt_key): give text or a list of {role, content} turns"));
  } else if (conversation) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no conversation under '", prompt_key,
                     "' (data.messages_key): give a list of {role, content} turns"));
  } else if (value == nullptr || value->is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no prompt under '", prompt_key,
                     "' (data.prompt_key): give text or a list of {role, content} turns"));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the prompt under '", prompt_key, "' (data.prompt_key) is ",
                     value->is_array() ? "an empty list" : absl::StrCat("a ", value->type_name()),
                     ", not text or a list of {role, content} turns"));
  }
  if (single_turn) {
    const Json* response = Find(row, keys.response);
    if (response == nullptr || !response->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": no response text under '", keys.response, "' (data.response_key)",
          response == nullptr ? "" : absl::StrCat(": it is a ", response->type_name())));
    }
    v1::ChatTurn& answer = *prompt.add_target();
    answer.set_role("assistant");
    answer.set_content(response->get<std::string>());
  }
  if (const Json* tools = keys.tools.empty() ? nullptr : Find(row, keys.tools); tools != nullptr) {
    prompt.set_tools_given(true);
    if (!tools->is_null()) {
      RETURN_IF_ERROR(ReadTools(
          *tools, absl::StrCat(where, ": the tools under '", keys.tools, "' (data.tools_key)"),
          prompt));
    }
  }
  if (const Json* thinking =
          keys.enable_thinking.empty() ? nullptr : Find(row, keys.enable_thinking);
      thinking != nullptr && !thinking->is_null()) {
    if (!thinking->is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": '", keys.enable_thinking,
                       "' (data.enable_thinking_key) must be true, false or null, not a ",
                       thinking->type_name()));
    }
    prompt.set_enable_thinking(thinking->get<bool>());
  }
  const Json* truth = Find(row, answer_key);
  // The default key falls back on verl's layout.
  if (truth == nullptr && answer_key == "ground_truth") {
    truth = Find(row, "reward_model.ground_truth");
  }
  if (truth != nullptr && !truth->is_null()) {
    prompt.set_ground_truth_json(truth->dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  if (const Json* source = Find(row, "data_source"); source != nullptr && source->is_string()) {
    prompt.set_data_source(source->get<std::string>());
  }
  // verl's extra_info column, for Python reward functions and remote rewards: an object, or
  // JSON text holding one (a column of mixed dicts is often written so).
  if (const Json* extra = Find(row, "extra_info"); extra != nullptr && !extra->is_null()) {
    ASSIGN_OR_RETURN(const Json object, ObjectOf(*extra, absl::StrCat(where, ": extra_info")));
    prompt.set_extra_info_json(object.dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  if (const int64_t bytes = static_cast<int64_t>(prompt.ByteSizeLong()); bytes > kMaxRowBytes) {
    const int64_t truth_bytes = static_cast<int64_t>(prompt.ground_truth_json().size());
    const int64_t extra_bytes = static_cast<int64_t>(prompt.extra_info_json().size());
    int64_t tools_bytes = 0;
    for (const std::string& tool : prompt.tools_json()) tools_bytes += tool.size();
    const int64_t prompt_bytes = bytes - truth_bytes - extra_bytes - tools_bytes;
    const int64_t most = std::max({truth_bytes, extra_bytes, tools_bytes, prompt_bytes});
    const std::string column = most == truth_bytes   ? std::string(answer_key)
                               : most == extra_bytes ? std::string("extra_info")
                               : most == tools_bytes ? keys.tools
                                                     : std::string(prompt_key);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the row carries ", bytes, " bytes to the workers, over the ",
                     kMaxRowBytes, " a row may; the most is under '", column, "' (", most,
                     " bytes): shorten it, or leave the row out"));
  }
  return prompt;
}

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

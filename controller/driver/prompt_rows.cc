// One row of a data file as the workers get it; see prompt_rows.h.
#include "controller/driver/prompt_rows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/job_defaults.h"
#include "common/status/status_macros.h"
#include "common/util/python_json.h"
#include "common/util/text.h"

namespace rlhfd::controller {
namespace {

using Json = RowJson;

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

}  // namespace

config::DocumentLimits JsonlLimits() {
  config::DocumentLimits limits;
  limits.max_text_bytes = kMaxLineBytes;
  limits.max_depth = 64;
  limits.max_values = 1'000'000;
  limits.max_scalar_bytes = kMaxLineBytes;
  return limits;
}

RowKeys::RowKeys(const v1::DataSpec& data, RowKind kind)
    : conversation(kind == RowKind::kConversation),
      response(conversation ? data.response_key() : ""),
      prompt(conversation && response.empty() ? KeyOrDefault(data.messages_key(), "messages_key")
                                              : KeyOrDefault(data.prompt_key(), "prompt_key")),
      answer(KeyOrDefault(data.answer_key(), "answer_key")),
      // verl's single-turn SFTDataset lists no tools and reads no enable_thinking.
      tools(conversation && response.empty() ? data.tools_key() : ""),
      enable_thinking(conversation && response.empty() ? data.enable_thinking_key() : "") {}

std::vector<std::string> RowKeys::Columns() const {
  std::vector<std::string> columns = {prompt,       answer, "reward_model", "data_source",
                                      "extra_info", tools,  response,       enable_thinking};
  std::vector<std::string> roots;
  for (const std::string& key : columns) {
    if (!key.empty()) roots.push_back(key.substr(0, key.find('.')));
  }
  return roots;
}

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

}  // namespace rlhfd::controller

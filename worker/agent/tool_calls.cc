#include "worker/agent/tool_calls.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rlhfd::agent {
namespace {

constexpr absl::string_view kOpen = "<tool_call>";
constexpr absl::string_view kClose = "</tool_call>";

// Byte offsets of each code point's start in UTF-8 `text` (a continuation byte never starts
// one, so malformed input still splits somewhere).
std::vector<size_t> CodePointStarts(absl::string_view text) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  return starts;
}

}  // namespace

ParsedResponse ParseHermesToolCalls(absl::string_view text) {
  ParsedResponse parsed;
  if (text.find(kOpen) == absl::string_view::npos || text.find(kClose) == absl::string_view::npos) {
    parsed.content = std::string(text);
    return parsed;
  }
  size_t at = 0;
  while (at <= text.size()) {
    const size_t open = text.find(kOpen, at);
    const size_t close =
        open == absl::string_view::npos ? open : text.find(kClose, open + kOpen.size());
    if (close == absl::string_view::npos) {
      absl::StrAppend(&parsed.content, text.substr(at));
      break;
    }
    absl::StrAppend(&parsed.content, text.substr(at, open - at));
    const absl::string_view body = text.substr(open + kOpen.size(), close - open - kOpen.size());
    at = close + kClose.size();
    const nlohmann::json call =
        nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    std::string error;
    if (call.is_discarded()) {
      error = "the tool call is not valid JSON";
    } else if (!call.is_object() || !call.contains("name") || !call.contains("arguments")) {
      error = "a tool call is a JSON object with \"name\" and \"arguments\"";
    } else if (!call["name"].is_string()) {
      error = "the tool call's \"name\" is not a string";
    }
    if (error.empty()) {
      parsed.calls.push_back(ToolCall{.name = call["name"].get<std::string>(),
                                      .arguments = call["arguments"],
                                      .block = parsed.calls.size() + parsed.malformed.size()});
    } else {
      parsed.malformed.push_back(
          MalformedToolCall{.text = std::string(body),
                            .error = error,
                            .block = parsed.calls.size() + parsed.malformed.size()});
    }
  }
  return parsed;
}

void ParsedResponse::KeepBlocks(size_t count) {
  calls.resize(std::min(calls.size(), count));
  malformed.resize(std::min(malformed.size(), count - calls.size()));
}

absl::StatusOr<TruncateSide> ParseTruncateSide(absl::string_view name) {
  if (name == "left") return TruncateSide::kLeft;
  if (name == "right") return TruncateSide::kRight;
  if (name == "middle") return TruncateSide::kMiddle;
  return absl::InvalidArgumentError(
      absl::StrCat("tool_response_truncate_side '", name, "' is not one of left, right, middle"));
}

std::string TruncateToolResponse(absl::string_view text, int64_t max_characters,
                                 TruncateSide side) {
  const std::vector<size_t> starts = CodePointStarts(text);
  const int64_t length = static_cast<int64_t>(starts.size());
  if (max_characters < 0 || length <= max_characters) return std::string(text);
  // Byte offset of the code point `index` (length: the end).
  auto offset = [&](int64_t index) {
    return index >= length ? text.size() : starts[static_cast<size_t>(index)];
  };
  switch (side) {
    case TruncateSide::kLeft:
      return absl::StrCat(text.substr(0, offset(max_characters)), "...(truncated)");
    case TruncateSide::kRight:
      return absl::StrCat("(truncated)...", text.substr(offset(length - max_characters)));
    case TruncateSide::kMiddle: {
      // verl: text[:n // 2] + "...(truncated)..." + text[-(n // 2):]. For n // 2 == 0 Python's
      // text[-0:] is the whole text; here it is nothing, which is what truncation means.
      const int64_t half = max_characters / 2;
      return absl::StrCat(text.substr(0, offset(half)), "...(truncated)...",
                          text.substr(offset(length - half)));
    }
  }
  return std::string(text);
}

std::string ToolErrorObservation(absl::string_view what) {
  return absl::StrCat("Error when executing tool: ", what);
}

}  // namespace rlhfd::agent

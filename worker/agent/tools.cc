#include "worker/agent/tools.h"

#include <charconv>
#include <cmath>
#include <csignal>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "worker/net/http_post.h"
#include "worker/reward/expression.h"

namespace rlhfd::agent {
namespace {

nlohmann::json FunctionSchema(const std::string& name, const std::string& description,
                              const std::string& parameter, const std::string& parameter_text) {
  nlohmann::json property = nlohmann::json::object();
  property["type"] = "string";
  property["description"] = parameter_text;
  nlohmann::json parameters = nlohmann::json::object();
  parameters["type"] = "object";
  parameters["properties"][parameter] = property;
  parameters["required"] = nlohmann::json::array({parameter});
  nlohmann::json function = nlohmann::json::object();
  function["name"] = name;
  function["description"] = description;
  function["parameters"] = parameters;
  nlohmann::json schema = nlohmann::json::object();
  schema["type"] = "function";
  schema["function"] = function;
  return schema;
}

// The one string argument a tool takes, or what is wrong with the arguments.
absl::StatusOr<std::string> StringArgument(const nlohmann::json& arguments,
                                           const std::string& name) {
  if (!arguments.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the arguments are not a JSON object: ", arguments.dump()));
  }
  const auto found = arguments.find(name);
  if (found == arguments.end() || !found->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the arguments need \"", name, "\" as a string: ", arguments.dump()));
  }
  return found->get<std::string>();
}

ToolObservation Error(absl::string_view what, absl::Time start) {
  return ToolObservation{
      .text = ToolErrorObservation(what), .error = true, .time = absl::Now() - start};
}

class CodeInterpreter : public Tool {
 public:
  CodeInterpreter(Sandbox* sandbox, std::string name, nlohmann::json schema)
      : Tool(std::move(name), std::move(schema)), sandbox_(sandbox) {}

  ToolObservation Call(const nlohmann::json& arguments) override {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> code = StringArgument(arguments, "code");
    if (!code.ok()) return Error(code.status().message(), start);
    absl::StatusOr<SandboxResult> ran = sandbox_->Run(*code);
    if (!ran.ok()) return Error(ran.status().message(), start);
    ToolObservation observation{.text = ran->stdout_text + ran->stderr_text,
                                .error = ran->exit_code != 0,
                                .time = absl::Now() - start};
    if (ran->timed_out) {
      absl::StrAppend(&observation.text, "\n[stopped: over the time limit of ",
                      absl::FormatDuration(ran->wall_time), "]");
    } else if (ran->output_truncated) {
      absl::StrAppend(&observation.text, "\n[stopped: too much output]");
    } else if (ran->signal != 0) {
      absl::StrAppend(&observation.text, "\n[stopped by signal ", ran->signal,
                      ran->signal == SIGXCPU ? ": over the CPU time limit" : "", "]");
    }
    return observation;
  }

 private:
  Sandbox* sandbox_;
};

// The shortest text that reads back as `value`: "14", "2.5", "0.1", "inf".
std::string ShortestNumber(double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (std::isnan(value)) return "nan";
  char buffer[64];
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof(buffer), value).ptr);
}

class Calculator : public Tool {
 public:
  Calculator(std::string name, nlohmann::json schema) : Tool(std::move(name), std::move(schema)) {}

  ToolObservation Call(const nlohmann::json& arguments) override {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> expression = StringArgument(arguments, "expression");
    if (!expression.ok()) return Error(expression.status().message(), start);
    const std::optional<double> value = reward::EvaluateArithmetic(*expression);
    if (!value.has_value()) {
      return Error(absl::StrCat("cannot evaluate '", *expression, "'"), start);
    }
    return ToolObservation{.text = ShortestNumber(*value), .time = absl::Now() - start};
  }
};

class HttpTool : public Tool {
 public:
  HttpTool(std::string name, nlohmann::json schema, std::string url, absl::Duration timeout)
      : Tool(std::move(name), std::move(schema)),
        post_{.url = std::move(url), .timeout = timeout, .max_reply_bytes = 1 << 20} {}

  ToolObservation Call(const nlohmann::json& arguments) override {
    const absl::Time start = absl::Now();
    if (!arguments.is_object()) {
      return Error(absl::StrCat("the arguments are not a JSON object: ", arguments.dump()), start);
    }
    const std::string body = nlohmann::json{{"name", name()}, {"arguments", arguments}}.dump(
        -1, ' ', false, nlohmann::json::error_handler_t::replace);
    const net::HttpReply reply =
        net::PostJson(post_, body, absl::StrCat("the ", name(), " service"));
    if (!reply.status.ok()) return Error(reply.status.message(), start);
    return ToolObservation{.text = reply.body, .time = absl::Now() - start};
  }

 private:
  net::HttpPost post_;
};

}  // namespace

std::unique_ptr<Tool> MakeHttpTool(std::string name, nlohmann::json schema, std::string url,
                                   absl::Duration timeout) {
  return std::make_unique<HttpTool>(std::move(name), std::move(schema), std::move(url), timeout);
}

std::unique_ptr<Tool> MakeCodeInterpreter(Sandbox* sandbox) {
  return std::make_unique<CodeInterpreter>(
      sandbox, "code_interpreter",
      FunctionSchema("code_interpreter", "Runs Python code and returns what it prints.", "code",
                     "The Python program to run"));
}

std::unique_ptr<Tool> MakeCalculator() {
  return std::make_unique<Calculator>(
      "calculator", FunctionSchema("calculator", "Evaluates an arithmetic expression.",
                                   "expression", "Numbers with + - * / // ** and parentheses"));
}

std::unique_ptr<Tool> MakeTool(const ToolSpec& spec, Sandbox* sandbox) {
  switch (spec.kind) {
    case ToolSpec::Kind::kCodeInterpreter:
      return std::make_unique<CodeInterpreter>(sandbox, spec.name, spec.schema);
    case ToolSpec::Kind::kCalculator:
      return std::make_unique<Calculator>(spec.name, spec.schema);
    case ToolSpec::Kind::kHttp:
      return MakeHttpTool(spec.name, spec.schema, spec.url, spec.timeout);
  }
  return nullptr;
}

void ToolSet::Add(std::unique_ptr<Tool> tool) {
  const std::string name = tool->name();
  tools_[name] = std::move(tool);
}

ToolObservation ToolSet::Call(const ToolCall& call) {
  const auto found = tools_.find(call.name);
  if (found == tools_.end()) {
    std::vector<std::string> names;
    for (const auto& [name, tool] : tools_) names.push_back(absl::StrCat("'", name, "'"));
    // verl: KeyError(f"Tool '{name}' not found. Available tools: {list(...)}"), as str(e) prints.
    return ToolObservation{.text = ToolErrorObservation(absl::StrCat(
                               "\"Tool '", call.name, "' not found. Available tools: [",
                               absl::StrJoin(names, ", "), "]\"")),
                           .error = true};
  }
  return found->second->Call(call.arguments);
}

std::vector<nlohmann::json> ToolSet::Schemas() const {
  std::vector<nlohmann::json> schemas;
  for (const auto& [name, tool] : tools_) schemas.push_back(tool->schema());
  return schemas;
}

}  // namespace rlhfd::agent

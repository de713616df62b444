// Reading tokenizer.json and tokenizer_config.json into a Tokenizer; see tokenizer.h.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "worker/model/json_fields.h"
#include "worker/model/tokenizer.h"
#include "worker/model/tokenizer_internal.h"

namespace rlhfd::model {

using tokenizer_internal::AddedToken;
using tokenizer_internal::CompileRegex;
using tokenizer_internal::kGpt2Pattern;
using tokenizer_internal::PreTokenizerStep;
using tokenizer_internal::Regex;

namespace {

std::string TokenContent(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return "";
}

}  // namespace

absl::Status Tokenizer::Impl::ParseNormalizer(const nlohmann::json& normalizer,
                                              absl::string_view source) {
  if (normalizer.is_null()) return absl::OkStatus();
  std::string type;
  RETURN_IF_ERROR(JsonFields(normalizer, source).String("type", "", &type));
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence" && normalizer.contains("normalizers") &&
             normalizer["normalizers"].is_array()) {
    for (const auto& inner : normalizer["normalizers"])
      RETURN_IF_ERROR(ParseNormalizer(inner, source));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(source, ": normalizer '",
                                                   SanitizeForDisplay(type, 40),
                                                   "' is not supported (NFC, Sequence)"));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const nlohmann::json& step,
                                                absl::string_view source) {
  if (step.is_null()) return absl::OkStatus();
  const JsonFields fields(step, source);
  std::string type;
  RETURN_IF_ERROR(fields.String("type", "", &type));
  if (type == "Sequence" && step.contains("pretokenizers") && step["pretokenizers"].is_array()) {
    for (const auto& inner : step["pretokenizers"])
      RETURN_IF_ERROR(ParsePreTokenizer(inner, source));
    return absl::OkStatus();
  }
  if (type == "Split") {
    std::string behavior;
    bool invert = false;
    RETURN_IF_ERROR(fields.String("behavior", "", &behavior));
    RETURN_IF_ERROR(fields.Bool("invert", false, &invert));
    if (!step.contains("pattern") || !step["pattern"].is_object() ||
        !step["pattern"].contains("Regex") || !step["pattern"]["Regex"].is_string() ||
        behavior != "Isolated" || invert) {
      return absl::InvalidArgumentError(
          absl::StrCat(source,
                       ": only Split pre-tokenizers with a Regex pattern, behavior Isolated and no "
                       "invert are supported"));
    }
    ASSIGN_OR_RETURN(Regex regex,
                     CompileRegex(step["pattern"]["Regex"].get<std::string>(), source));
    pre.push_back({PreTokenizerStep::kSplit, regex, false});
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    PreTokenizerStep byte_level{PreTokenizerStep::kByteLevel, nullptr, false};
    bool use_regex = true;
    RETURN_IF_ERROR(fields.Bool("add_prefix_space", false, &byte_level.add_prefix_space));
    RETURN_IF_ERROR(fields.Bool("use_regex", true, &use_regex));
    if (use_regex) {
      ASSIGN_OR_RETURN(byte_level.regex, CompileRegex(kGpt2Pattern, source));
    }
    pre.push_back(byte_level);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": pre-tokenizer '", SanitizeForDisplay(type, 40),
                   "' is not supported (Split, ByteLevel, Sequence)"));
}

absl::Status Tokenizer::Impl::ParsePostProcessor(const nlohmann::json& processor,
                                                 absl::string_view source) {
  if (processor.is_null()) return absl::OkStatus();
  std::string type;
  RETURN_IF_ERROR(JsonFields(processor, source).String("type", "", &type));
  if (type == "ByteLevel") return absl::OkStatus();  // Offsets only; ids unchanged.
  if (type == "Sequence" && processor.contains("processors") &&
      processor["processors"].is_array()) {
    for (const auto& inner : processor["processors"]) {
      RETURN_IF_ERROR(ParsePostProcessor(inner, source));
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing" && processor.contains("single") &&
      processor["single"].is_array()) {
    bool seen_sequence = false;
    for (const auto& piece : processor["single"]) {
      if (!piece.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": post-processor pieces must be objects"));
      }
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].is_object() &&
                 piece["SpecialToken"].contains("id") && piece["SpecialToken"]["id"].is_string()) {
        const std::string name = piece["SpecialToken"]["id"].get<std::string>();
        auto it = vocab.find(name);
        if (it == vocab.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              source, ": post-processor names unknown token '", SanitizeForDisplay(name, 60), "'"));
        }
        (seen_sequence ? suffix_ids : prefix_ids).push_back(it->second);
      }
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": post-processor '", SanitizeForDisplay(type, 40),
                   "' is not supported (ByteLevel, TemplateProcessing)"));
}

absl::Status Tokenizer::Impl::ParseBpeModel(const nlohmann::json& model, absl::string_view source,
                                            int32_t* max_id_out) {
  int32_t& max_id = *max_id_out;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": vocab id of '", SanitizeForDisplay(token, 60), "' is invalid"));
    }
    vocab[token] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  int32_t rank = 0;
  for (const auto& merge : model["merges"]) {
    std::string key;
    if (merge.is_string()) {
      key = merge.get<std::string>();
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      key = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(source, ": merge ", rank, " is malformed"));
    }
    merge_rank.emplace(std::move(key), rank++);
  }
  bool byte_fallback = false;
  RETURN_IF_ERROR(JsonFields(model, source).Bool("ignore_merges", false, &ignore_merges));
  RETURN_IF_ERROR(JsonFields(model, source).Bool("byte_fallback", false, &byte_fallback));
  if (byte_fallback) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": byte_fallback BPE (SentencePiece-style) is not supported"));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseAddedTokens(const nlohmann::json& root, absl::string_view source,
                                               int32_t* max_id_out) {
  int32_t& max_id = *max_id_out;
  if (root.contains("added_tokens")) {
    if (!root["added_tokens"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": added_tokens must be a list"));
    }
    for (const auto& token : root["added_tokens"]) {
      if (!token.is_object() || !token.contains("id") || !token["id"].is_number_integer() ||
          !token.contains("content") || !token["content"].is_string() ||
          token["content"].get<std::string>().empty() || token["id"].get<int64_t>() < 0 ||
          token["id"].get<int64_t>() > (1 << 24)) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": malformed added token"));
      }
      AddedToken entry{token["id"].get<int32_t>(), token["content"].get<std::string>(), false};
      const JsonFields fields(token, source);
      RETURN_IF_ERROR(fields.Bool("special", false, &entry.special));
      RETURN_IF_ERROR(fields.Bool("lstrip", false, &entry.lstrip));
      RETURN_IF_ERROR(fields.Bool("rstrip", false, &entry.rstrip));
      vocab[entry.content] = entry.id;
      max_id = std::max(max_id, entry.id);
      added.push_back(entry);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(absl::string_view json, absl::string_view source) {
  ASSIGN_OR_RETURN(const nlohmann::json root, ParseModelJson(json, source));
  try {
    return FromParsedJson(root, source);
  } catch (const std::exception& error) {
    // Every read is typed; this boundary keeps a file from ever throwing past it.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot be read (", SanitizeForDisplay(error.what(), 200), ")"));
  }
}

absl::StatusOr<Tokenizer> Tokenizer::FromParsedJson(const nlohmann::json& root,
                                                    absl::string_view source) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto impl = std::make_unique<Impl>();
  const nlohmann::json& model = root.contains("model") ? root["model"] : nlohmann::json();
  std::string model_type;
  if (model.is_object()) RETURN_IF_ERROR(JsonFields(model, source).String("type", "", &model_type));
  if (!model.is_object() || model_type != "BPE" || !model.contains("vocab") ||
      !model["vocab"].is_object() || !model.contains("merges") || !model["merges"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": model must be a BPE model with vocab and merges"));
  }
  int32_t max_id = -1;
  RETURN_IF_ERROR(impl->ParseBpeModel(model, source, &max_id));
  RETURN_IF_ERROR(impl->ParseAddedTokens(root, source, &max_id));
  std::stable_sort(
      impl->added.begin(), impl->added.end(),
      [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < impl->added.size(); ++i) impl->added_index[impl->added[i].id] = i;
  impl->id_to_token.assign(max_id + 1, "");
  for (const auto& [token, id] : impl->vocab) impl->id_to_token[id] = token;

  const auto section = [&root](const char* key) {
    return root.contains(key) ? root[key] : nlohmann::json();
  };
  RETURN_IF_ERROR(impl->ParseNormalizer(section("normalizer"), source));
  RETURN_IF_ERROR(impl->ParsePreTokenizer(section("pre_tokenizer"), source));
  RETURN_IF_ERROR(impl->ParsePostProcessor(section("post_processor"), source));
  if (const nlohmann::json decoder = section("decoder"); !decoder.is_null()) {
    std::string type;
    RETURN_IF_ERROR(JsonFields(decoder, source).String("type", "", &type));
    if (type != "ByteLevel") {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": decoder '", SanitizeForDisplay(type, 40), "' is not supported (ByteLevel)"));
    }
  }
  return Tokenizer(std::move(impl));
}

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(absl::string_view text,
                                                     absl::string_view source) {
  ASSIGN_OR_RETURN(const nlohmann::json config, ParseModelJson(text, source));
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  TokenizerConfig out;
  // A list of named templates (some repositories) is read as no template: pick one with
  // model.chat_template.
  if (config.contains("chat_template") && config["chat_template"].is_string()) {
    out.chat_template = config["chat_template"].get<std::string>();
  }
  if (config.contains("bos_token")) out.bos_token = TokenContent(config["bos_token"]);
  return out;
}

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 256 << 20));
  ASSIGN_OR_RETURN(Tokenizer tokenizer, FromJson(text, path));
  const std::string config_path = dir + "/tokenizer_config.json";
  TokenizerConfig config;
  auto config_text = ReadFileToString(config_path, 64 << 20);
  if (config_text.ok()) {
    ASSIGN_OR_RETURN(config, ParseTokenizerConfig(*config_text, config_path));
  } else if (!absl::IsNotFound(config_text.status())) {
    return config_text.status();
  }
  std::string jinja = config.chat_template;
  tokenizer.impl_->bos_token = config.bos_token;
  if (jinja.empty()) {
    if (auto file = ReadFileToString(dir + "/chat_template.jinja", 1 << 20); file.ok())
      jinja = *file;
  }
  ASSIGN_OR_RETURN(ChatTemplate chat, ChooseChatTemplate("auto", jinja));
  // Qwen2.5's template adds this system prompt when the conversation has none.
  constexpr char kQwenSystem[] =
      "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  tokenizer.set_chat_template(chat, absl::StrContains(jinja, kQwenSystem) ? kQwenSystem : "");
  tokenizer.impl_->chatml = tokenizer_internal::ChatMlStyle::OfTemplate(jinja);
  tokenizer.impl_->llama3 = tokenizer_internal::Llama3Style::OfTemplate(jinja);
  // A template of these families laid out otherwise than rlhfd renders them: refused, saying why.
  const auto refuse = [&tokenizer](const char* why) {
    tokenizer.set_chat_template(ChatTemplate::kNone);
    tokenizer.impl_->refused_template = why;
  };
  if (chat == ChatTemplate::kLlama3 && !tokenizer.impl_->llama3.known) {
    refuse(
        "this model's chat template writes Llama 3.1's system turn (the knowledge cutoff and "
        "the date) otherwise than Llama 3.1's, 3.2's and 3.3's templates do, which rlhfd does "
        "not render: give plain-text prompts, or set model.chat_template: llama3 to render its "
        "turns without that system turn");
  }
  if (chat == ChatTemplate::kNone && !jinja.empty()) {
    refuse(
        "this model's chat template is of a family rlhfd does not render (it renders ChatML's: "
        "Qwen2, Qwen2.5, Qwen3, SmolLM2; and Llama 3's): give plain-text prompts, or set "
        "model.chat_template: chatml or llama3 where the model was trained on that layout");
  }
  if (chat == ChatTemplate::kChatMl && !tokenizer.impl_->chatml.think_rules_known) {
    refuse(
        "this model's chat template opens a <think> block in its generation prompt and lays "
        "out its answers' blocks otherwise than Qwen3's template (QwQ's, Qwen3.5's, OLMo 3 "
        "Think's), which rlhfd does not render yet (Qwen3-Thinking-2507's it does): give "
        "plain-text prompts, or set model.chat_template: chatml to render its turns without "
        "that opening");
  }
  return tokenizer;
}

}  // namespace rlhfd::model

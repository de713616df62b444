// safetensors header checks: every malformed file is a clear error naming the problem, never a
// crash; and config.json refusals for what the transformer does not support.
#include <catch2/catch.hpp>

#include <cstring>

#include "worker/model/model_config.h"
#include "worker/model/safetensors_format.h"

namespace rlhfd::model {
namespace {

// A file with tensors "a" (F32 [2, 3], 24 bytes) and "b" (BF16 [4], 8 bytes).
std::string ValidFile() {
  std::vector<TensorEntry> entries = {{"a", TensorDtype::kF32, {2, 3}, 0, 24},
                                      {"b", TensorDtype::kBF16, {4}, 24, 32}};
  return SerializeSafetensorsHeader(entries, {{"format", "pt"}}) + std::string(32, '\x01');
}

// A file whose header is `json`, followed by `data_bytes` of data.
std::string FileWithHeader(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t size = json.size();
  std::memcpy(out.data(), &size, 8);  // Little-endian hosts only, as is every supported one.
  return out + json + std::string(data_bytes, '\0');
}

std::string ErrorOf(const std::string& file) {
  auto header = ParseSafetensorsHeader(file, "model.safetensors");
  REQUIRE_FALSE(header.ok());
  CHECK(absl::IsInvalidArgument(header.status()));
  return std::string(header.status().message());
}

}  // namespace

TEST_CASE("a valid file parses, sorted by name, with its metadata", "[safetensors]") {
  auto header = ParseSafetensorsHeader(ValidFile(), "model.safetensors");
  REQUIRE(header.ok());
  REQUIRE(header->tensors.size() == 2);
  CHECK(header->tensors[0].name == "a");
  CHECK(header->tensors[0].shape == std::vector<int64_t>{2, 3});
  CHECK(header->tensors[1].dtype == TensorDtype::kBF16);
  CHECK(header->metadata.at("format") == "pt");
  CHECK(header->data_offset % 8 == 0);
}

TEST_CASE("malformed safetensors files are refused with the reason", "[safetensors][errors]") {
  const std::string valid = ValidFile();
  CHECK_THAT(ErrorOf(valid.substr(0, 5)), Catch::Contains("only 5 bytes; truncated?"));
  CHECK_THAT(ErrorOf(valid.substr(0, valid.size() - 8)),
             Catch::Contains("tensor 'b' has data_offsets [24, 32) outside the 24-byte data"));
  std::string huge = valid;
  huge[7] = '\x7f';
  CHECK_THAT(ErrorOf(huge), Catch::Contains("exceeds the"));
  std::string past_end = valid;
  past_end[0] = '\xff';
  past_end[1] = '\xff';
  CHECK_THAT(ErrorOf(past_end), Catch::Contains("runs past the end of the"));
  CHECK_THAT(ErrorOf(FileWithHeader("{\"a\": [1,", 0)), Catch::Contains("header is not a JSON object"));
  CHECK_THAT(ErrorOf(FileWithHeader("[1, 2]", 0)), Catch::Contains("header is not a JSON object"));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", 1)),
             Catch::Contains("tensor 'a' has unsupported dtype \"F8_E4M3\""));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)),
             Catch::Contains("negative or non-integer dimension"));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)),
             Catch::Contains("tensor 'a' spans 8 bytes but shape x dtype needs 12"));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8)),
             Catch::Contains("outside the"));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12)),
             Catch::Contains("tensors 'a' and 'b' overlap"));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"a": {"dtype": "F32", "shape": [2]}})", 8)),
             Catch::Contains("needs dtype, shape and data_offsets"));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 8]}})", 8)),
             Catch::Contains("too large to address"));
  CHECK_THAT(ErrorOf(FileWithHeader(R"({"__metadata__": {"k": 1}})", 0)),
             Catch::Contains("__metadata__ value of 'k' is not a string"));
}

TEST_CASE("config.json: unsupported architectures and options are refused by name",
          "[model_config][errors]") {
  auto error = [](const std::string& json) {
    auto config = ParseModelConfig(json, "config.json");
    REQUIRE_FALSE(config.ok());
    return std::string(config.status().message());
  };
  const std::string base = R"("vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2)";
  CHECK_THAT(error(R"({"architectures": ["GPT2LMHeadModel"], )" + base + "}"),
             Catch::Contains("architecture 'GPT2LMHeadModel' is not supported"));
  // A known family with another head, or a known prefix of another family, is not a match.
  CHECK_THAT(error(R"({"architectures": ["Qwen2MoeForCausalLM"], )" + base + "}"),
             Catch::Contains("'Qwen2MoeForCausalLM' is not supported; supported: Llama, Mistral, "
                             "Qwen2, Qwen3 with ForCausalLM, ForSequenceClassification or "
                             "ForTokenClassification"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLMX"], )" + base + "}"),
             Catch::Contains("is not supported"));
  // Wrong types name the key instead of throwing; sizes are bounded.
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "hidden_act": 7, )" + base + "}"),
             Catch::Contains("'hidden_act' must be a string, not 7"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForSequenceClassification"], "num_labels": "1", )" + base + "}"),
             Catch::Contains("'num_labels' must be a whole number in [1, 65536], not \"1\""));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "rms_norm_eps": "tiny", )" + base + "}"),
             Catch::Contains("'rms_norm_eps' must be a number"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": 1, )" + base + "}"),
             Catch::Contains("'tie_word_embeddings' must be true or false"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": 5}, )" + base + "}"),
             Catch::Contains("'rope_type' must be a string"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "eos_token_id": ["x"], )" + base + "}"),
             Catch::Contains("'eos_token_id' must be token ids"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 99999999999, "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2})"),
             Catch::Contains("'vocab_size' must be a whole number in [1, 16777216]"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "num_local_experts": 8, )" + base + "}"),
             Catch::Contains("mixture-of-experts"));
  // AWQ / GPTQ / FP8 checkpoints (Qwen2.5-7B-Instruct-AWQ's config): named, not a list of
  // missing and unexpected tensors.
  CHECK_THAT(error(R"({"architectures": ["Qwen2ForCausalLM"], "quantization_config": {"bits": 4,
    "quant_method": "awq", "version": "gemm"}, )" +
                   base + "}"),
             Catch::Contains("the checkpoint is quantized (awq): give the unquantized model"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu", )" + base + "}"),
             Catch::Contains("hidden_act 'gelu' is not supported"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "yarn"}, )" + base + "}"),
             Catch::Contains("rope type 'yarn' is not supported"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "num_key_value_heads": 3, )" + base + "}"),
             Catch::Contains("must be a multiple of num_key_value_heads"));
  CHECK_THAT(error(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 0})"),
             Catch::Contains("'vocab_size' must be a whole number in [1,"));
  CHECK_THAT(error("[]"), Catch::Contains("config.json: not a JSON object"));
  auto ok = ParseModelConfig(R"({"architectures": ["Qwen3ForTokenClassification"], "num_labels": 1, )" + base + "}",
                             "config.json");
  REQUIRE(ok.ok());
  CHECK(ok->head == HeadKind::kTokenScore);
  CHECK(ok->qk_norm);
}

TEST_CASE("sliding windows are accepted when every sequence fits inside them",
          "[model_config]") {
  const std::string base = R"("vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2)";
  // Mistral-7B-v0.1 has sliding_window 4096.
  auto mistral = ParseModelConfig(R"({"architectures": ["MistralForCausalLM"], "sliding_window": 4096, )" +
                                      base + "}",
                                  "config.json");
  REQUIRE(mistral.ok());
  CHECK(mistral->sliding_window == 4096);
  CHECK(CheckSequenceFits(*mistral, 512 + 1024, "max_prompt_length + max_response_length").ok());
  CHECK(CheckSequenceFits(*mistral, 4096, "the sequences").ok());
  const absl::Status longer = CheckSequenceFits(*mistral, 4097, "max_prompt_length + max_response_length");
  CHECK(absl::IsInvalidArgument(longer));
  CHECK_THAT(std::string(longer.message()),
             Catch::Contains("window of 4096 tokens") &&
                 Catch::Contains("max_prompt_length + max_response_length reach 4097 tokens"));
  // Qwen2 slides only with use_sliding_window; its sliding_window alone means nothing.
  auto qwen = ParseModelConfig(R"({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 32768, )" +
                                   base + "}",
                               "config.json");
  REQUIRE(qwen.ok());
  CHECK(qwen->sliding_window == 0);
  auto sliding_qwen = ParseModelConfig(
      R"({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 128, )" +
          base + "}",
      "config.json");
  REQUIRE(sliding_qwen.ok());
  CHECK(sliding_qwen->sliding_window == 128);
  // Mistral with sliding_window: null attends fully.
  auto full = ParseModelConfig(R"({"architectures": ["MistralForCausalLM"], "sliding_window": null, )" +
                                   base + "}",
                               "config.json");
  REQUIRE(full.ok());
  CHECK(full->sliding_window == 0);
  // Without the key, transformers' MistralConfig slides over 4096 tokens, and so does this.
  auto unsaid =
      ParseModelConfig(R"({"architectures": ["MistralForCausalLM"], )" + base + "}", "config.json");
  REQUIRE(unsaid.ok());
  CHECK(unsaid->sliding_window == 4096);
  // Qwen3Config's head_dim default is 128, not hidden_size / heads (8 here).
  auto qwen3 =
      ParseModelConfig(R"({"architectures": ["Qwen3ForCausalLM"], )" + base + "}", "config.json");
  REQUIRE(qwen3.ok());
  CHECK(qwen3->head_dim == 128);
}

}  // namespace rlhfd::model

// The docs that tables of code are copied into stay in step with the code: every key of verl's
// trainer config is in docs/coming-from-verl.md with what convert-verl does with it, made from the
// converter's tables; every field of rlhfd.v1.JobSpec is in docs/config-reference.md, every key
// there is a field, and every field has its comment in job_spec.proto (the authority the
// reference points to); data.md lists the data sources `rule: auto` scores as the rule table has
// them, and the verl sources it refuses.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config/reward_rules.h"
#include "common/config/verl_import.h"
#include "common/config/verl_key_doc.h"
#include "common/config/verl_key_tables.h"
#include "common/util/files.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {

TEST_CASE("data.md lists the data sources rule auto scores, as the rule table has them", "[docs]") {
  auto doc = ReadFileToString(std::string(RLHFD_DOCS_DIR) + "/data.md");
  REQUIRE(doc.ok());
  for (const RewardRuleInfo& rule : RewardRules()) {
    if (rule.data_sources.empty()) continue;
    std::vector<std::string> sources;
    for (absl::string_view source : absl::StrSplit(
             absl::string_view(rule.data_sources.data(), rule.data_sources.size()), ", ")) {
      sources.push_back(absl::StrCat("`", source, "`"));
    }
    const std::string row =
        absl::StrCat("| `", std::string(rule.name), "` | ", absl::StrJoin(sources, ", "), " |");
    INFO(row);
    CHECK_THAT(*doc, Catch::Contains(row));
  }
  for (const VerlSourceWithoutRule& source : kVerlSourcesWithoutRule) {
    std::vector<std::string> sources;
    for (absl::string_view name : absl::StrSplit(
             absl::string_view(source.data_sources.data(), source.data_sources.size()), ", ")) {
      sources.push_back(absl::StrCat("`", name, "`"));
    }
    const std::string row =
        absl::StrCat("| ", absl::StrJoin(sources, ", "), " | ", std::string(source.why), " |");
    INFO(row);
    CHECK_THAT(*doc, Catch::Contains(row));
  }
}

// The page's per-key tables are made from the converter's tables (verl_key_doc.h), one set for
// each of verl's trainers; to rewrite them after changing a table:
// RLHFD_UPDATE_DOCS=1 build/tests/config_test "[docs]".
TEST_CASE("coming-from-verl.md lists every verl key with what convert-verl does", "[docs]") {
  const std::string path = std::string(RLHFD_DOCS_DIR) + "/coming-from-verl.md";
  for (const auto& [trainer, marker] :
       {std::pair{VerlTrainer::kPpo, "verl-keys"}, std::pair{VerlTrainer::kSft, "verl-sft-keys"}}) {
    auto doc = ReadFileToString(path);
    REQUIRE(doc.ok());
    auto tables = VerlKeyTablesMarkdown(trainer);
    REQUIRE(tables.ok());
    const std::string begin = absl::StrCat("<!-- ", marker, ":begin -->\n");
    const std::string end = absl::StrCat("<!-- ", marker, ":end -->");
    const size_t from = doc->find(begin);
    const size_t to = doc->find(end);
    INFO(marker);
    REQUIRE(from != std::string::npos);
    REQUIRE(to != std::string::npos);
    const std::string current = doc->substr(from + begin.size(), to - from - begin.size());
    if (current != *tables && std::getenv("RLHFD_UPDATE_DOCS") != nullptr) {
      const std::string updated = doc->substr(0, from + begin.size()) + *tables + doc->substr(to);
      std::ofstream(path) << updated;
      SUCCEED("rewrote " << path);
      continue;
    }
    INFO("run RLHFD_UPDATE_DOCS=1 build/tests/config_test \"[docs]\" to rewrite the tables");
    CHECK(current == *tables);
  }
  auto doc = ReadFileToString(path);
  REQUIRE(doc.ok());
  // Every key the direct table maps is on the page with where it lands (an SFT key as the SFT
  // config names it).
  for (const auto& [verl, ours] : VerlDirectMappings()) {
    INFO(verl);
    const std::string shown = absl::StartsWith(verl, "sft.") ? verl_keys::PpoKeyAsSft(verl) : verl;
    CHECK_THAT(*doc, Catch::Contains(absl::StrCat("| `", shown, "` | ")));
    CHECK_THAT(*doc, Catch::Contains(absl::StrCat("mapped to `", ours, "` |")));
  }
}

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Dotted paths of JobSpec's fields; messages are walked into (their own path is listed too),
// except protobuf's own (a google.protobuf.Struct is a free-form value in a config).
void FieldPaths(const Descriptor* message, const std::string& prefix, std::set<std::string>* out,
                int depth = 0) {
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* field = message->field(i);
    const std::string path =
        prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
    out->insert(path);
    if (field->type() == FieldDescriptor::TYPE_MESSAGE && depth < 6 &&
        !absl::StartsWith(field->message_type()->full_name(), "google.protobuf.")) {
      FieldPaths(field->message_type(), path, out, depth + 1);
    }
  }
}

// `section` keys of the reference's tables: (section, key) for each key cell ("`a` / `b`" is two).
std::vector<std::string> TableKeys(const std::string& doc) {
  std::vector<std::string> keys;
  std::string section;
  const std::regex heading(R"(^## `([a-z_.0-9]+)`)");
  const std::regex key_cell(R"(^\| ([^|]+) \|)");
  const std::regex quoted("`([a-z_.0-9]+)`");
  for (absl::string_view line : absl::StrSplit(doc, '\n')) {
    const std::string text(line);
    std::smatch match;
    if (absl::StartsWith(text, "## ")) {
      section = std::regex_search(text, match, heading) ? match[1].str() : "";
      if (absl::StartsWith(text, "## Top level")) section = "-";
      continue;
    }
    if (section.empty() || !std::regex_search(text, match, key_cell)) continue;
    const std::string cell = match[1].str();
    if (cell == "key" || absl::StartsWith(cell, "---")) continue;
    for (auto it = std::sregex_iterator(cell.begin(), cell.end(), quoted);
         it != std::sregex_iterator(); ++it) {
      keys.push_back(section == "-" ? (*it)[1].str() : absl::StrCat(section, ".", (*it)[1].str()));
    }
  }
  return keys;
}

}  // namespace

TEST_CASE("config-reference.md and job_spec.proto describe the same fields", "[docs]") {
  const absl::StatusOr<std::string> read =
      ReadFileToString(std::string(RLHFD_DOCS_DIR) + "/config-reference.md");
  REQUIRE(read.ok());
  const std::string& doc = *read;
  std::set<std::string> fields;
  FieldPaths(v1::JobSpec::descriptor(), "", &fields);

  // Every key in the reference's tables is a field.
  const std::vector<std::string> keys = TableKeys(doc);
  CHECK(keys.size() > 60);
  for (const std::string& key : keys) {
    INFO("docs/config-reference.md names " << key);
    CHECK(fields.count(key) == 1);
  }
  // Every field is in the reference: as a table key, or (sections written as prose: critic,
  // reference, reward) backquoted by its own name or its last two parts. Messages are covered by
  // their fields.
  std::set<std::string> quoted;
  const std::regex backquoted("`([a-z_.0-9]+)");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), backquoted);
       it != std::sregex_iterator(); ++it) {
    quoted.insert((*it)[1].str());
  }
  const std::set<std::string> in_tables(keys.begin(), keys.end());
  std::set<std::string> messages;
  for (const std::string& field : fields) {
    for (const std::string& other : fields) {
      if (absl::StartsWith(other, field + ".")) messages.insert(field);
    }
  }
  for (const std::string& field : fields) {
    if (messages.count(field)) continue;
    const std::vector<std::string> parts = absl::StrSplit(field, '.');
    const std::string last = parts.back();
    const std::string last_two =
        parts.size() >= 2 ? absl::StrCat(parts[parts.size() - 2], ".", last) : last;
    INFO("the field " << field << " is not in docs/config-reference.md");
    CHECK((in_tables.count(field) || quoted.count(last) || quoted.count(last_two) ||
           quoted.count(field)));
  }

  // Every field has its comment in the .proto: the line before it is a comment, or the field's
  // line ends with one, or it follows a field of its type under one comment ("AdamW betas").
  const absl::StatusOr<std::string> proto_read =
      ReadFileToString(std::string(RLHFD_PROTO_DIR) + "/rlhfd/v1/job_spec.proto");
  REQUIRE(proto_read.ok());
  const std::string& proto = *proto_read;
  const std::regex field_line(
      R"(^\s*(repeated |optional )?([A-Za-z0-9_.]+) ([a-z_0-9]+) = [0-9]+;)");
  std::string previous, previous_type;
  int checked = 0;
  for (absl::string_view raw : absl::StrSplit(proto, '\n')) {
    const std::string line(raw);
    std::smatch match;
    if (std::regex_search(line, match, field_line) &&
        !absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "//")) {
      ++checked;
      INFO("job_spec.proto: the field " << match[3].str() << " has no comment");
      CHECK((absl::StartsWith(absl::StripLeadingAsciiWhitespace(previous), "//") ||
             absl::StrContains(line, "//") || previous_type == match[2].str()));
      previous_type = match[2].str();
    } else if (!absl::StripAsciiWhitespace(line).empty()) {
      previous_type.clear();
    }
    if (!absl::StripAsciiWhitespace(line).empty()) previous = line;
  }
  CHECK(checked > 60);
}

}  // namespace rlhfd::config

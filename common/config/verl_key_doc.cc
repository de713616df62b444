// The per-key tables of docs/coming-from-verl.md; see verl_key_doc.h.
#include "common/config/verl_key_doc.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/config/config_document.h"
#include "common/config/verl_defaults.h"
#include "common/config/verl_key_tables.h"
#include "common/status/status_macros.h"

namespace rlhfd::config {
namespace {

using Json = nlohmann::json;

void Leaves(const Json& node, const std::string& path, std::map<std::string, Json>* out) {
  if (node.is_object() && !node.empty()) {
    for (const auto& [key, value] : node.items()) {
      Leaves(value, path.empty() ? key : path + "." + key, out);
    }
  } else if (!path.empty()) {
    (*out)[path] = node;
  }
}

// A table heading's section: actor_rollout_ref.<part>, else the top-level key.
std::string Section(const std::string& key) {
  const size_t first = key.find('.');
  if (first == std::string::npos) return key;
  if (key.substr(0, first) != "actor_rollout_ref") return key.substr(0, first);
  const size_t second = key.find('.', first + 1);
  return second == std::string::npos ? key : key.substr(0, second);
}

std::string Cell(const std::string& text) { return absl::StrReplaceAll(text, {{"|", "\\|"}}); }

std::string Default(const Json& value) {
  if (value.is_null()) return "null";
  return Cell(value.is_string() ? value.get<std::string>() : value.dump());
}

constexpr char kHeader[] =
    "| verl key | verl's default | what convert-verl does |\n| --- | --- | --- |\n";

}  // namespace

absl::StatusOr<std::string> VerlKeyTablesMarkdown(VerlTrainer trainer) {
  const bool sft = trainer == VerlTrainer::kSft;
  ASSIGN_OR_RETURN(Json defaults, ParseConfigDocument(VerlTrainerYaml(trainer), "verl defaults"));
  std::map<std::string, Json> leaves;
  Leaves(defaults, "", &leaves);
  // The tables name an SFT config's keys as the PPO config's (verl_key_tables.h).
  const auto fate = [&](const std::string& key) {
    return verl_keys::Fate(sft ? verl_keys::SftKeyAsPpo(key) : key);
  };
  std::map<std::string, std::vector<std::string>> sections;
  for (const auto& [key, value] : leaves) {
    sections[sft ? key.substr(0, key.find('.')) : Section(key)].push_back(key);
  }
  std::string out;
  for (const auto& [section, keys] : sections) {
    absl::StrAppend(&out, "\n### `", section, "` (", keys.size(),
                    keys.size() == 1 ? " key" : " keys", ")\n\n", kHeader);
    for (const std::string& key : keys) {
      absl::StrAppend(&out, "| `", key, "` | `", Default(leaves.at(key)), "` | ", Cell(fate(key)),
                      " |\n");
    }
  }
  // Keys the tables know that verl 0.9's config no longer has (older run scripts set them).
  std::set<std::string> older;
  for (const auto& [from, to] : verl_keys::DirectTable()) older.insert(from);
  for (const auto* table :
       {&verl_keys::DerivedTable(), &verl_keys::HarmlessTable(), &verl_keys::UnsupportedTable()}) {
    for (const auto& [key, why] : *table) older.insert(key);
  }
  std::string rows;
  if (sft) {
    for (const auto& [old_key, new_key] : verl_keys::LegacySftRenames()) {
      absl::StrAppend(&rows, "| `", old_key, "` | (fsdp_sft_trainer) | read as `", new_key,
                      "` |\n");
    }
  }
  for (const std::string& table_key : older) {
    // Each trainer's own: an SFT config's keys are the tables' "sft." ones.
    if (absl::StartsWith(table_key, "sft.") != sft) continue;
    const std::string key = sft ? verl_keys::PpoKeyAsSft(table_key) : table_key;
    if (leaves.count(key)) continue;
    // A setting inside one of verl's mappings (apply_chat_template_kwargs' {}), or a key verl
    // no longer has.
    const std::string parent = key.substr(0, key.rfind('.'));
    const std::string where = leaves.count(parent) ? absl::StrCat("(inside `", parent, "`)")
                              : sft                ? "(fsdp_sft_trainer)"
                                                   : "(not in verl 0.9)";
    absl::StrAppend(&rows, "| `", key, "` | ", where, " | ", Cell(verl_keys::Fate(table_key)),
                    " |\n");
  }
  if (!rows.empty()) {
    absl::StrAppend(&out,
                    sft ? "\n### Keys of verl's SFT trainer before 0.9 (fsdp_sft_trainer)\n\n"
                        : "\n### Keys of older verl versions, and inside verl's mappings\n\n",
                    kHeader, rows);
  }
  return out;
}

}  // namespace rlhfd::config

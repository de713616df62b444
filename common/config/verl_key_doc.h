// docs/coming-from-verl.md's tables of every verl key and what convert-verl does with it, made
// from the tables the converter runs with (verl_key_tables.h) and verl's own config
// (verl_defaults.h), so the page cannot drift from the code; docs_test compares them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/config/verl_defaults.h"

namespace rlhfd::config {

// The markdown between the page's "verl-keys" (PPO) or "verl-sft-keys" markers: one table per
// section of the trainer's config (every key, verl's default, its fate), then the keys of older
// verl versions the tables know.
absl::StatusOr<std::string> VerlKeyTablesMarkdown(VerlTrainer trainer);

}  // namespace rlhfd::config

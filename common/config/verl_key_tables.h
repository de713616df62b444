// The verl keys the importer knows, by what happens to them: copied to an rlhfd key, dropped with
// a warning (setting them changes nothing about training), or refused with the reason; and which
// values count as verl's default. Read by verl_import.cc.
//
// One set of tables serves both of verl's trainers: the SFT trainer's keys are read in the PPO
// config's names (SftKeyAsPpo), and the keys only the SFT trainer has, or that mean something
// else there, as "sft." + their own name.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace rlhfd::config::verl_keys {

// verl key → rlhfd key, copied as they are (values are checked by rlhfd's validator).
const std::vector<std::pair<std::string, std::string>>& DirectTable();

// Keys whose value does not change what rlhfd computes: key → why, warned about when set.
const std::map<std::string, std::string>& HarmlessTable();

// Keys that would change training if ignored: key → why, refused when set.
const std::map<std::string, std::string>& UnsupportedTable();

// Keys the converter reads and turns into something else (verl_import.cc's code): key → what
// becomes of it. With the direct table, every key the converter reads.
const std::map<std::string, std::string>& DerivedTable();

// Families of keys not read, by a part of their name: ("global_profiler.", why) matches keys
// starting with it, (".profiler.", why) keys containing it, ("._target_", why) keys ending with it.
const std::vector<std::pair<std::string, std::string>>& IgnoredFamilyTable();

// The family `key` belongs to (its why), or nullptr.
const std::string* IgnoredFamily(const std::string& key);

// What becomes of `key`, in words, from the tables above: "mapped to `x`", "derived: ...",
// "refused unless at verl's default: ...", "ignored: ...", or not read.
std::string Fate(const std::string& key);

// verl's SFT trainer config (sft_trainer_engine.yaml) key in the PPO config's names: model.* is
// actor_rollout_ref.model.*, optim.* the actor's optim.*, engine.* its fsdp_config.*
// (engine.strategy its strategy), checkpoint.* and profiler.* its own,
// data.micro_batch_size_per_gpu / max_token_len_per_gpu / use_dynamic_bsz its ppo_ micro-batch
// keys; the SFT trainer's own keys (data.messages_key, data.max_length, trainer.seed, ...) and
// those that mean more there (data.train_batch_size: also the mini-batch) are "sft." + the key;
// the rest (data.train_files, data.val_files, most of trainer.*) are named alike.
std::string SftKeyAsPpo(const std::string& sft_key);

// The inverse of SftKeyAsPpo, for messages: a key as the SFT config names it (unchanged when it
// is not one of its translations).
std::string PpoKeyAsSft(const std::string& key);

// Keys of verl's SFT trainer before 0.9 (verl.trainer.fsdp_sft_trainer, whose example scripts
// users still run) → the key verl 0.9.1's sft_trainer reads for the same thing.
const std::map<std::string, std::string>& LegacySftRenames();

// Whether a table above names `key` (a key the converter reads or judges).
bool Known(const std::string& key);

// The refused key (UnsupportedTable) `key` lies inside, a mapping whose default is empty
// (data.apply_chat_template_kwargs for data.apply_chat_template_kwargs.enable_thinking); "" if
// none.
std::string RefusedParent(const std::string& key);

// Values that mean "not given": null (interpolations are resolved before the tables are read).
bool Unset(const nlohmann::json& value);

// Whether a refused or ignored key's value is the one verl would have anyway.
bool IsVerlNeutral(const std::string& key, const nlohmann::json& value);

}  // namespace rlhfd::config::verl_keys

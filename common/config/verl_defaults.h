// verl's trainer configs with every default filled in, built in from configs/verl/:
// verl-0.9.1-ppo_trainer.yaml (verl 0.9.1's verl/trainer/config/_generated_ppo_trainer.yaml,
// copied as it is) and verl-0.9.1-sft_trainer.yaml (its SFT trainer's sft_trainer_engine.yaml as
// Hydra composes it); tests/fixtures/verl/convert_parity.py checks both against the installed
// verl. convert-verl lays a verl config over one of them, so keys a run leaves out get verl's
// values, and the `${...}` in it derive what verl derives.
#pragma once

namespace rlhfd::config {

// Which of verl's trainers a config is for: `python -m verl.trainer.main_ppo` (PPO, GRPO and
// the other RL estimators) or `python -m verl.trainer.sft_trainer` (supervised fine-tuning).
enum class VerlTrainer { kPpo, kSft };

// The trainer's YAML text, interpolations unresolved.
const char* VerlTrainerYaml(VerlTrainer trainer);

}  // namespace rlhfd::config

// verl's PPO trainer config with every default filled in, built in from
// configs/verl/verl-0.9.1-ppo_trainer.yaml (verl 0.9.1's
// verl/trainer/config/_generated_ppo_trainer.yaml, copied as it is;
// tests/fixtures/verl/convert_parity.py checks the copy against the installed verl). convert-verl lays
// a verl config over it, so keys a run leaves out get verl's values, and the
// `${...}` in it derive what verl derives.
#pragma once

namespace rlhfd::config {

// The YAML text, interpolations unresolved.
const char* VerlPpoTrainerYaml();

}  // namespace rlhfd::config

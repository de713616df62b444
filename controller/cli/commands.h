// rlhfctl's commands, one function each; each prints its result (a table, or JSON with --json)
// and returns the exit code (client.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/config/verl_defaults.h"
#include "controller/cli/client.h"

namespace rlhfd::cli {

// Cluster (cluster_commands.cc).
int Workers(Client& client);
int Cluster(Client& client);
// drain and undrain.
int SetDrained(Client& client, const std::string& worker_id, bool drained);

// Configs (config_commands.cc). `verl`: the file is a config of that verl trainer (or "-":
// its defaults with the overrides), converted first; none: an rlhfd config.
using VerlSource = std::optional<config::VerlTrainer>;
int Submit(Client& client, const std::string& path, VerlSource verl,
           std::vector<std::string> overrides, std::string* job_id);
// Offline: the whole config as it will run, each value that came from a default or was derived
// marked so (with how it compares to verl's default), or every problem at once.
int Validate(const std::string& path, VerlSource verl, std::vector<std::string> overrides);
int ConvertVerl(const std::string& path, config::VerlTrainer trainer,
                const std::vector<std::string>& overrides);

// Jobs (job_commands.cc).
int Jobs(Client& client);
int Status(Client& client, const std::string& job_id);
int Cancel(Client& client, const std::string& job_id);
int Delete(Client& client, const std::string& job_id);
int Watch(Client& client, const std::string& job_id);
int Metrics(Client& client, const std::string& job_id);
// submit --wait: the job's progress until it ends; the exit code is its outcome.
int Wait(Client& client, const std::string& job_id);
// export: the actor of a checkpoint, as the driver exported it, copied to --out.
int Export(Client& client, const std::string& job_id);

}  // namespace rlhfd::cli

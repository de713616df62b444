// rlhfctl's commands, one function each; each prints its result (a table, or JSON with --json)
// and returns the exit code (client.h).
#pragma once

#include <string>
#include <vector>

#include "controller/cli/client.h"

namespace rlhfd::cli {

// Cluster (cluster_commands.cc).
int Workers(Client& client);
int Cluster(Client& client);
// drain and undrain.
int SetDrained(Client& client, const std::string& worker_id, bool drained);

// Configs (config_commands.cc). `from_verl`: the file is a verl config (or "-": verl's defaults
// with the overrides).
int Submit(Client& client, const std::string& path, bool from_verl,
           std::vector<std::string> overrides, std::string* job_id);
// Offline: the whole config as it will run, each value that came from a default or was derived
// marked so (with how it compares to verl's default), or every problem at once.
int Validate(const std::string& path, bool from_verl, std::vector<std::string> overrides);
int ConvertVerl(const std::string& path, const std::vector<std::string>& overrides);

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

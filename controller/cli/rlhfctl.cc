// rlhfctl: the command-line client of the rlhfd control plane. Tables for people, --json for
// scripts; exit 0 on success, 1 when the controller refuses or cannot be reached, 2 for usage.
// This file: the usage text, the command table and main; the commands are commands.h's.
#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_options.h"
#include "common/rpc/rpc_flags.h"
#include "common/util/program_help.h"
#include "common/util/program_setup.h"
#include "controller/cli/cli_flags.h"
#include "controller/cli/client.h"
#include "controller/cli/commands.h"

namespace rlhfd::cli {
namespace {

constexpr char kUsage[] = R"(rlhfctl [flags] COMMAND [ARGS]: the command line of an rlhfd cluster.

Jobs:
  submit FILE [key=value ...]       validate a job config (YAML/JSON) on the controller and queue
                                    it; key.path=value overrides (Hydra style, ~key removes one);
                                    --wait follows it to its end with a progress line
  submit --from-verl FILE|- [k=v ...]   the same from a verl config and verl overrides
                                    (add --sft for verl's SFT trainer's)
  validate FILE [key=value ...]     check a config here, offline: every problem at once, or the
                                    effective config with defaults and derived values marked
  convert-verl FILE|- [k=v ...]     print the rlhfd config a verl config (and overrides) means;
                                    what is not supported goes to stderr ('-': verl's defaults);
                                    --sft: a config of verl's SFT trainer (sft_trainer, or the
                                    older fsdp_sft_trainer), an rlhfd job with trainer.mode sft
  jobs                              list jobs, oldest first (every page of them)
  status JOB                        one job, and why it is in its state
  watch JOB                         follow a job's events (states, each step's key metrics)
  metrics JOB                       a job's per-step metric history (--json: every metric;
                                    --follow: new steps as they come, to the job's end)
  export JOB --out DIR [--step N] [--merged]
                                    copy a checkpoint's actor, a Hugging Face directory (a LoRA
                                    job: its PEFT adapter; --merged: the merged model), to DIR
                                    (the checkpoint directory must be readable here)
  cancel JOB                        cancel a job that has not ended
  delete JOB                        forget an ended job
Cluster:
  workers                           registered workers
  cluster                           counts of workers, GPUs and jobs
  drain WORKER                      send a worker no new work (lasts across restarts)
  undrain WORKER                    lift a drain

The controller is --controller or $RLHFD_CONTROLLER (default 127.0.0.1:50051). The token is read
from --token_file or $RLHFD_TOKEN_FILE (the controller's <state_dir>/token); --token and
$RLHFD_TOKEN give it directly (they show in `ps`). With TLS: --tls_ca=CA.pem, and for mTLS
--tls_cert=CERT.pem --tls_key=KEY.pem. Exit codes: 0 success, 1 refused or unreachable (the
message says why), 2 usage.
)";

int Run(const std::vector<char*>& args, bool from_verl, bool sft) {
  // Command → (arguments it takes; whether key=value overrides may follow).
  struct Shape {
    size_t arguments;
    bool overrides;
  };
  static const std::map<std::string, Shape> kCommands = {
      {"workers", {0, false}}, {"cluster", {0, false}}, {"jobs", {0, false}},
      {"submit", {1, true}},   {"validate", {1, true}}, {"convert-verl", {1, true}},
      {"status", {1, false}},  {"cancel", {1, false}},  {"delete", {1, false}},
      {"watch", {1, false}},   {"drain", {1, false}},   {"undrain", {1, false}},
      {"metrics", {1, false}}, {"export", {1, false}}};
  if (args.size() < 2) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const std::string command = args[1];
  auto known = kCommands.find(command);
  if (known == kCommands.end()) {
    std::cerr << "unknown command '" << command << "'\n\n" << kUsage;
    return kExitUsage;
  }
  const Shape shape = known->second;
  if (args.size() < 2 + shape.arguments ||
      (!shape.overrides && args.size() != 2 + shape.arguments)) {
    std::cerr << "usage: rlhfctl " << command << (shape.arguments ? " ARG" : "")
              << (shape.overrides ? " [key=value ...]" : "") << "\n";
    return kExitUsage;
  }
  if (from_verl && command != "submit" && command != "validate") {
    std::cerr << "--from-verl goes with submit and validate\n";
    return kExitUsage;
  }
  if (sft && !from_verl && command != "convert-verl") {
    std::cerr << "--sft goes with convert-verl, or with --from-verl\n";
    return kExitUsage;
  }
  const config::VerlTrainer trainer = sft ? config::VerlTrainer::kSft : config::VerlTrainer::kPpo;
  const VerlSource verl = from_verl ? VerlSource(trainer) : std::nullopt;
  const std::vector<std::string> overrides(args.begin() + 2 + std::min<size_t>(shape.arguments, 1),
                                           args.end());
  // Offline commands need no controller.
  if (command == "validate") return Validate(args[2], verl, overrides);
  if (command == "convert-verl") return ConvertVerl(args[2], trainer, overrides);
  auto token = ResolveClientToken(TokenFlag(), TokenFileFlag());
  if (!token.ok()) {
    std::cerr << "error: " << token.status().message() << "\n";
    return kExitUsage;
  }
  auto channel = MakeChannel(ControllerAddress(), RpcOptionsFromFlags());
  if (!channel.ok()) {
    std::cerr << "error: " << channel.status().message() << "\n";
    return kExitUsage;
  }
  Client client(*channel, *token);
  if (command == "workers") return Workers(client);
  if (command == "cluster") return Cluster(client);
  if (command == "jobs") return Jobs(client);
  if (command == "submit") {
    std::string job_id;
    const int submitted = Submit(client, args[2], verl, overrides, &job_id);
    if (submitted != kExitOk || !absl::GetFlag(FLAGS_wait)) return submitted;
    return Wait(client, job_id);
  }
  if (command == "status") return Status(client, args[2]);
  if (command == "cancel") return Cancel(client, args[2]);
  if (command == "delete") return Delete(client, args[2]);
  if (command == "watch") return Watch(client, args[2]);
  if (command == "metrics") return Metrics(client, args[2]);
  if (command == "export") return Export(client, args[2]);
  return SetDrained(client, args[2], /*drained=*/command == "drain");
}

}  // namespace
}  // namespace rlhfd::cli

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  rlhfd::HandleHelp(argc, argv, rlhfd::cli::kUsage);
  // --from-verl is spelled as verl users type it, which Abseil flag names cannot be; --sft goes
  // with it (and with convert-verl), so it is read here too.
  bool from_verl = false, sft = false;
  std::vector<char*> kept;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--from-verl" || std::string(argv[i]) == "--from_verl") {
      from_verl = true;
    } else if (std::string(argv[i]) == "--sft") {
      sft = true;
    } else {
      kept.push_back(argv[i]);
    }
  }
  absl::SetProgramUsageMessage(rlhfd::cli::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(static_cast<int>(kept.size()), kept.data());
  return rlhfd::cli::Run(args, from_verl, sft);
}

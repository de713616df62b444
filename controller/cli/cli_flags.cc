// rlhfctl's own flags (cli_flags.h).
#include "controller/cli/cli_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, controller, "",
          "host:port of rlhfd-controller (default $RLHFD_CONTROLLER or 127.0.0.1:50051)");
ABSL_FLAG(bool, json, false, "Print replies as JSON for scripts");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call");
ABSL_FLAG(bool, wait, false,
          "submit: follow the job to its end with a progress line (step/total, ETA, reward); the "
          "exit code is its outcome (0 succeeded, 1 otherwise)");
ABSL_FLAG(bool, follow, false, "metrics: keep printing new steps until the job ends");
ABSL_FLAG(
    std::string, out, "",
    "export: the directory to write the Hugging Face model (a LoRA job: its PEFT adapter) to");
ABSL_FLAG(bool, merged, false,
          "export: for a LoRA job, the Hugging Face model with the adapters merged, not the "
          "PEFT adapter");
ABSL_FLAG(int64_t, step, 0, "export: the checkpoint's step (default: the job's newest)");
ABSL_FLAG(int32_t, page_size, 0,
          "jobs: jobs per ListJobs call (0: the controller's default, 100; at most 1000); every "
          "page is listed either way");

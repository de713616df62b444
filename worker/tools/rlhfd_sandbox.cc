// rlhfd-sandbox: starts one process of the code interpreter's sandbox for the worker
// (worker/agent/sandbox_child.h). The worker runs it with posix_spawn, its descriptors placed as
// SandboxFd says; it is not meant to be run by hand.
#include "worker/agent/sandbox_child.h"

int main() { return rlhfd::agent::RunSandboxLauncher(); }

// Process-wide settings every rlhfd program (daemons, tools, benchmarks, test binaries) takes
// first, before any thread starts.
#pragma once

namespace rlhfd {

// Abseil's mutexes without their deadlock detector. Debian builds Abseil without NDEBUG, which
// leaves the detector on: every absl::Mutex lock (gRPC's own among them) then records lock
// order in one process-wide graph under one spin lock, about 15 % of a gRPC server's CPU and a
// point where all of its threads queue (measured: docs/PERFORMANCE.md, "Fan-out through the
// workers"). Release builds of Abseil run with it off; so do we.
void SetUpProgram();

}  // namespace rlhfd

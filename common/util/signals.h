// Termination handling for daemons: block SIGTERM/SIGINT in every thread (call first in main,
// before any thread starts) and wait for one on the main thread, which then drains.
#pragma once

namespace rlhfd {

// Blocks SIGTERM, SIGINT and SIGHUP; threads created afterwards inherit the mask.
void BlockTerminationSignals();

// Waits for one of the blocked signals and returns its number.
int WaitForTerminationSignal();

}  // namespace rlhfd

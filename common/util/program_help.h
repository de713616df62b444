// --help for every rlhfd program: the usage text, then each of the program's own flags with its
// default and help, and exit 0. (Abseil's --help lists only flags defined in a file named like
// the program, so for ours it printed "No flags matched" and exited 1.)
#pragma once

#include <string>

namespace rlhfd {

// When argv holds --help, -h or --helpfull: prints `usage` and the flags defined in rlhfd's own
// sources (and, for --helpfull, every flag) to stdout and exits 0. Call before parsing flags.
void HandleHelp(int argc, char** argv, const std::string& usage);

}  // namespace rlhfd

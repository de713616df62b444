// --help; see program_help.h.
#include "common/util/program_help.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"

namespace rlhfd {

void HandleHelp(int argc, char** argv, const std::string& usage) {
  bool help = false, full = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    help |= arg == "--help" || arg == "-h" || arg == "-help" || arg == "--helpshort";
    full |= arg == "--helpfull";
  }
  if (!help && !full) return;
  std::cout << usage;
  if (!usage.empty() && usage.back() != '\n') std::cout << "\n";
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string file = flag->Filename();
    const bool ours = absl::StrContains(file, "controller/") || absl::StrContains(file, "worker/") ||
                      absl::StrContains(file, "common/") || absl::StrContains(file, "tests/");
    if (!flag->IsRetired() && (full || ours)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::cout << "\nFlags:\n";
  for (const absl::CommandLineFlag* flag : flags) {
    std::cout << "  --" << flag->Name() << " (default: "
              << (flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue()) << ")\n      "
              << flag->Help() << "\n";
  }
  std::exit(0);
}

}  // namespace rlhfd

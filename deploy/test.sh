#!/usr/bin/env bash
# The README's test command: installs what is missing (deploy/setup.sh), builds with ccache, and
# runs the fuzzers briefly (where clang exists) and every test. [gpu] tests report "Skipped"
# without a GPU.
#   RLHFD_BUILD_DIR=build   where to build
#   RLHFD_JOBS=N            parallel compile jobs (default: cores)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${RLHFD_BUILD_DIR:-${repo_root}/build}"
jobs="${RLHFD_JOBS:-$(nproc)}"

"${repo_root}/deploy/setup.sh"
"${repo_root}/deploy/build.sh"
"${repo_root}/deploy/fuzz.sh"
cd "${build_dir}"
ctest --output-on-failure --timeout 600 -j "${jobs}"

#!/usr/bin/env bash
# Configures (once) and builds rlhfd with Ninja and ccache. Needs deploy/setup.sh to have run.
#   deploy/build.sh [TARGET ...]   everything, or only the targets named (and what they need)
#   RLHFD_BUILD_DIR=build   where to build
#   RLHFD_BUILD_TYPE=RelWithDebInfo
#   RLHFD_JOBS=N            parallel compile jobs (default: cores)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${RLHFD_BUILD_DIR:-${repo_root}/build}"
jobs="${RLHFD_JOBS:-$(nproc)}"

# ccache keeps warm builds (and CI re-runs) to seconds; the compiler check must not defeat it.
export CCACHE_DIR="${CCACHE_DIR:-${HOME}/.cache/ccache}"
# Paths relative to the checkout, so a fresh clone elsewhere (as CI makes) still hits the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-${repo_root}}"
# -g makes ccache hash the working directory unless told not to; a clone elsewhere would miss.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"

if [[ ! -f "${build_dir}/build.ninja" ]]; then
  cmake -S "${repo_root}" -B "${build_dir}" -G Ninja \
    -DCMAKE_BUILD_TYPE="${RLHFD_BUILD_TYPE:-RelWithDebInfo}" ${RLHFD_CMAKE_ARGS:-}
fi
targets=()
for target in "$@"; do targets+=(--target "${target}"); done
cmake --build "${build_dir}" -j "${jobs}" "${targets[@]}"

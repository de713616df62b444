#!/usr/bin/env bash
# Runs docs/quickstart.md's commands marked `<!-- quickstart: run -->`, in order, in one shell, on
# a fresh copy of the repository's tracked files (the build and the virtualenv are linked in, not
# rebuilt), and fails on the first command that fails.
#   tests/docs/quickstart_test.sh REPO_ROOT BUILD_DIR
set -euo pipefail
repo="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
work="$(mktemp -d /tmp/rlhfd-quickstart-XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "${work}"' EXIT

# A fresh checkout: the files git would commit (tracked or not ignored), nothing generated.
(cd "${repo}" && git ls-files -z --cached --others --exclude-standard |
   xargs -0 -I{} cp --parents {} "${work}/") 2>/dev/null ||
  cp -r "${repo}/." "${work}/"
ln -sfn "${build}" "${work}/build"
ln -sfn "${repo}/.venv" "${work}/.venv"

# The marked blocks, in the order the page has them, each followed by how long it took (the
# page promises times: section 6's run is measured here).
script="${work}/quickstart-commands.sh"
awk '
  /^## / { section = $0 }
  /<!-- quickstart: run -->/ { take = 1; next }
  /^```sh/ && take == 1 { inside = 1; print "block_start=${SECONDS}"; next }
  /^```/ && inside == 1 {
    inside = 0; take = 0
    printf "echo \"quickstart_test: %s: $((SECONDS - block_start)) s\" >&2\n", section
    next
  }
  inside == 1 { print }
' "${repo}/docs/quickstart.md" > "${script}"
grep -qv '^block_start=\|^echo "quickstart_test' "${script}" ||
  { echo "quickstart_test: no runnable commands found" >&2; exit 1; }
echo "quickstart_test: running $(grep -cv '^block_start=\|^echo "quickstart_test' "${script}") commands in ${work}"
cd "${work}"
set -x
# shellcheck disable=SC1090
source "${script}"

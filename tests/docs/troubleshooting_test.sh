#!/usr/bin/env bash
# docs/troubleshooting.md is built from the real error messages: the text of every entry's heading
# (between its backquotes) is found verbatim in the daemons' and tools' sources.
#   tests/docs/troubleshooting_test.sh REPO_ROOT
set -euo pipefail
repo="$(cd "$1" && pwd)"
count=0
missing=0
while IFS= read -r message; do
  count=$((count + 1))
  if ! grep -rqF --include=*.cc --include=*.h -- "${message}" "${repo}/controller" "${repo}/worker" "${repo}/common"; then
    echo "troubleshooting_test: not in the sources: ${message}" >&2
    missing=$((missing + 1))
  fi
done < <(sed -n 's/^### `\(.*\)`$/\1/p' "${repo}/docs/troubleshooting.md")
echo "troubleshooting_test: ${count} messages, ${missing} missing"
((count >= 15 && missing == 0))

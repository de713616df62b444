#!/usr/bin/env bash
# Runs the README's main job (deploy/demo.sh) on the built binaries and checks that it succeeded
# and that the mean reward climbed: its last ten steps average at least 0.1 and five times its
# first ten (chance is about 0.01; with learning off, lr 1e-12, a run stays at 0.004).
#   tests/docs/demo_test.sh REPO_ROOT BUILD_DIR
set -euo pipefail
repo="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
work="$(mktemp -d /tmp/rlhfd-demo-test-XXXXXX)"
trap 'rm -rf "${work}"' EXIT
mkdir -p "${work}/bin"
ln -s "${build}/controller/rlhfd-controller" "${build}/worker/rlhfd-worker" \
  "${build}/controller/rlhfctl" "${work}/bin/"
RLHFD_BIN_DIR="${work}/bin" RLHFD_DEMO_DIR="${work}/demo" "${repo}/deploy/demo.sh" | tee "${work}/out"
summary="$(grep '^steps 1-' "${work}/out")"
read -r first last < <(echo "${summary}" | awk '{print $3, $6}')
echo "demo_test: first ${first}, last ${last}"
awk -v first="${first}" -v last="${last}" 'BEGIN { exit !(last >= 0.1 && last >= 5 * first) }'

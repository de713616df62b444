#!/usr/bin/env bash
# Runs the README's main job (deploy/demo.sh) on the built binaries and checks that it succeeded
# and that the mean reward climbed from chance to at least 0.9 of its maximum (1): its last ten
# steps average at least 0.9, its first ten below 0.2. With learning off (lr 1e-12) the same run
# stays at chance (about 0.002), which the second, short run checks, so the climb is learning.
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
awk -v first="${first}" -v last="${last}" 'BEGIN { exit !(last >= 0.9 && first < 0.2) }'
grep -q "val-core step 0: 0.00" "${work}/out"
# Learning off: 30 steps at lr 1e-12 stay at chance.
sed 's/lr: 1.0e-3/lr: 1.0e-12/; s/total_steps: 150/total_steps: 30/' \
  "${repo}/configs/demo-digits.yaml" > "${work}/frozen.yaml"
sed -i "s|tests/fixtures|${repo}/tests/fixtures|g" "${work}/frozen.yaml"
RLHFD_BIN_DIR="${work}/bin" RLHFD_DEMO_DIR="${work}/frozen" RLHFD_DEMO_CONFIG="${work}/frozen.yaml" \
  "${repo}/deploy/demo.sh" > "${work}/frozen.out"
read -r frozen_first frozen_last < <(grep '^steps 1-' "${work}/frozen.out" | awk '{print $3, $6}')
echo "demo_test: learning off: first ${frozen_first}, last ${frozen_last}"
awk -v last="${frozen_last}" 'BEGIN { exit !(last < 0.1) }'

#!/usr/bin/env bash
# The release tarball: deploy/bundle.sh --tarball makes rlhfd-VERSION-linux-ARCH.tar.gz; unpacked
# in a fresh directory (no checkout, no build directory beside it) its ./demo.sh runs the README's
# main job, shortened, to SUCCEEDED with the bundle's own binaries and libraries.
#   tests/docs/bundle_test.sh REPO_ROOT BUILD_DIR PYTHON_WITH_TORCH
set -euo pipefail
repo="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
work="$(mktemp -d /tmp/rlhfd-bundle-test-XXXXXX)"
trap 'rm -rf "${work}"' EXIT
RLHFD_BUILD_DIR="${build}" "${repo}/deploy/bundle.sh" --tarball "${work}/dist"
tarball=$(ls "${work}"/dist/rlhfd-*-linux-*.tar.gz)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "${build}/CMakeCache.txt")
[[ "$(basename "${tarball}")" == rlhfd-"${version}"* ]]
mkdir "${work}/fresh"
tar -C "${work}/fresh" -xzf "${tarball}"
release=$(ls -d "${work}"/fresh/rlhfd-*)
grep -q "^${version}" "${release}/VERSION"
# Nothing of the build is reachable from the release: its binaries load the bundled libraries.
if ldd "${release}/bin/rlhfd-controller" | grep -q "${build}"; then
  echo "bundle_test: the release's controller loads libraries from ${build}" >&2
  exit 1
fi
# The code interpreter's launcher beside the worker, which finds it there; it starts with an
# empty environment, so it needs nothing but libc.
if [[ ! -x "${release}/bin/rlhfd-sandbox" ]] || ldd "${release}/bin/rlhfd-sandbox" | grep -q "libstdc++"; then
  echo "bundle_test: bin/rlhfd-sandbox is missing or needs libstdc++" >&2
  exit 1
fi
RLHFD_PYTHON="$3" RLHFD_DEMO_DIR="${work}/demo" RLHFD_DEMO_OVERRIDES="trainer.total_steps=8 trainer.val_every=-1" \
  "${release}/demo.sh" | tee "${work}/out"
grep -q "succeeded: finished 8 steps" "${work}/out"

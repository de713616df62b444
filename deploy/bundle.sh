#!/usr/bin/env bash
# Packs the built daemons (and optionally test binaries) with the non-system shared libraries
# they need (gRPC, protobuf, Abseil, yaml-cpp, ...) into one relocatable folder, for hosts that
# lack those libraries — e.g. GPU machines that only have CUDA, NCCL and PyTorch.
#   deploy/bundle.sh OUT_DIR [EXTRA_BINARY ...]
#   deploy/bundle.sh --tarball DIST_DIR   # DIST_DIR/rlhfd-VERSION-linux-ARCH.tar.gz, a release
# Layout: OUT_DIR/bin (daemons, rlhfd-sandbox beside the worker, extras), OUT_DIR/lib (libraries; RPATH $ORIGIN/../lib),
# OUT_DIR/share/rlhfd/reward_runner.py (Python reward functions) and OUT_DIR/env.sh, which finds the host's LibTorch and CUDA libraries for LibTorch binaries.
# LibTorch, CUDA, NCCL and glibc/libstdc++ are not copied: the target supplies them. A release
# adds VERSION, configs/, the systemd units, Slurm script and Kubernetes manifests, and demo.sh
# with the demo's tiny model and data, so `./demo.sh` runs the README's main job from the
# unpacked folder.
# The controller's Parquet reader (lib/librlhfd_parquet.so with Arrow, about 60 MB) comes along
# when built; RLHFD_BUNDLE_PARQUET=0 leaves it out (the controller then reads JSONL only), e.g.
# for a GPU machine that is lent folders of at most 64 MiB.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${RLHFD_BUILD_DIR:-${repo_root}/build}"
usage="usage: deploy/bundle.sh OUT_DIR [EXTRA_BINARY ...] | deploy/bundle.sh --tarball DIST_DIR"
tarball=""
if [[ "${1:-}" == "--tarball" ]]; then
  dist="${2:?${usage}}"
  mkdir -p "${dist}"
  dist="$(cd "${dist}" && pwd)"
  version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "${build_dir}/CMakeCache.txt")
  [[ -n "${version}" ]] || { echo "bundle: no project version in ${build_dir}/CMakeCache.txt (build first)" >&2; exit 1; }
  if commit=$(git -C "${repo_root}" rev-parse --short HEAD 2>/dev/null); then version+="+g${commit}"; fi
  release_name="rlhfd-${version}-linux-$(uname -m)"
  stage="$(mktemp -d)"
  trap 'rm -rf "${stage}"' EXIT
  out="${stage}/${release_name}"
  tarball="${dist}/${release_name}.tar.gz"
  shift 2
else
  out="${1:?${usage}}"
  shift
fi
command -v patchelf >/dev/null || { echo "bundle: patchelf missing; run deploy/setup.sh" >&2; exit 1; }

binaries=("${build_dir}/controller/rlhfd-controller" "${build_dir}/worker/rlhfd-worker"
          "${build_dir}/worker/rlhfd-sandbox" "${build_dir}/controller/rlhfctl" "$@")
rm -rf "${out}"
mkdir -p "${out}/bin" "${out}/lib"

# Provided by every Linux host, or by the target's CUDA/PyTorch installation.
is_host_library() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*) return 0 ;;
    libgcc_s.so*|libstdc++.so*|libgomp.so*) return 0 ;;
    libtorch*|libc10*|libcuda*|libcudart*|libnccl*|libcublas*|libcudnn*|libcufft*|libcurand*) return 0 ;;
    libcusparse*|libcusolver*|libcupti*|libnvJitLink*|libnvshmem*|libnvrtc*|libcufile*|libnvToolsExt*) return 0 ;;
  esac
  return 1
}

# Copies the libraries `file` needs that the host does not provide into lib/.
copy_libraries() {
  while read -r name path; do
    [[ -n "${path}" && -f "${path}" ]] || continue
    is_host_library "${name}" && continue
    if [[ ! -f "${out}/lib/${name}" ]]; then
      cp -L "${path}" "${out}/lib/${name}"
      strip --strip-debug "${out}/lib/${name}"
      patchelf --set-rpath '$ORIGIN' "${out}/lib/${name}"
    fi
  done < <(ldd "$1" | awk '$2 == "=>" {print $1, $3}')
}

for binary in "${binaries[@]}"; do
  [[ -x "${binary}" ]] || { echo "bundle: ${binary} not built" >&2; exit 1; }
  cp "${binary}" "${out}/bin/"
  strip --strip-debug "${out}/bin/$(basename "${binary}")"
  patchelf --set-rpath '$ORIGIN/../lib' "${out}/bin/$(basename "${binary}")"
  copy_libraries "${binary}"
done
# The worker's runner of Python reward functions, where it looks: ../share/rlhfd of its binary.
mkdir -p "${out}/share/rlhfd"
cp "${repo_root}/worker/reward/python/reward_runner.py" "${out}/share/rlhfd/"
parquet_plugin="${build_dir}/controller/librlhfd_parquet.so"
if [[ "${RLHFD_BUNDLE_PARQUET:-1}" != 0 && -f "${parquet_plugin}" ]]; then
  cp "${parquet_plugin}" "${out}/lib/"
  strip --strip-debug "${out}/lib/librlhfd_parquet.so"
  patchelf --set-rpath '$ORIGIN' "${out}/lib/librlhfd_parquet.so"
  copy_libraries "${parquet_plugin}"
fi

cat > "${out}/env.sh" <<'ENV'
# Source this before running LibTorch binaries from the bundle: it puts the host's LibTorch and
# CUDA libraries on LD_LIBRARY_PATH. Set RLHFD_PYTHON to the python that has torch.
python="${RLHFD_PYTHON:-python3}"
torch_lib="$("${python}" -W ignore -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)"
if [[ -n "${torch_lib}" ]]; then
  export LD_LIBRARY_PATH="${torch_lib}:${torch_lib}/../../nvidia/cu13/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
fi
export NCCL_NVLS_ENABLE=0
ENV
if [[ -n "${tarball}" ]]; then
  echo "${version}" > "${out}/VERSION"
  cp -r "${repo_root}/configs" "${out}/configs"
  mkdir -p "${out}/systemd" "${out}/slurm" "${out}/kubernetes" "${out}/tests/fixtures/models" \
    "${out}/tests/fixtures/data"
  cp "${repo_root}"/deploy/systemd/*.service "${out}/systemd/"
  cp "${repo_root}"/deploy/slurm/*.sbatch "${out}/slurm/"
  cp "${repo_root}"/deploy/kubernetes/*.yaml "${out}/kubernetes/"
  cp "${repo_root}/deploy/demo.sh" "${out}/demo.sh"
  # The demo job's model and data, where configs/demo-digits.yaml names them.
  cp -r "${repo_root}/tests/fixtures/models/tiny-qwen2" "${out}/tests/fixtures/models/"
  cp "${repo_root}"/tests/fixtures/data/repeat_*.jsonl "${out}/tests/fixtures/data/"
  tar -C "$(dirname "${out}")" -czf "${tarball}" "${release_name}"
  echo "bundle: ${tarball} ($(du -sh "${tarball}" | cut -f1))"
else
  echo "bundle: ${out} ($(du -sh "${out}" | cut -f1)): $(ls "${out}/bin" | tr '\n' ' ')"
fi
